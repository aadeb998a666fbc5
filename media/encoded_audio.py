"""The agent's audio handed to aiortc already encoded, in the event loop.

Given a decoded frame, aiortc's sender first computes the frame's RTP audio level, then sends
the frame to a thread pool to be encoded and waits for the result. Under a profile of 16 calls,
that round trip (a submit, a pool thread woken, the result handed back to the loop) cost the
API process about 14% of its CPU, more than the encoding itself (4%). Given an `av.Packet`, the
sender only packs it. So this track encodes each frame of its source where the frame is made,
for the codec the call negotiated, and sends no audio level: Opus with the voice's own encoder
(media/opus_voice.py), G.711 with aiortc's.
"""

from __future__ import annotations

import fractions
from collections import deque
from collections.abc import Callable
from typing import Protocol

import av
from aiortc import MediaStreamTrack, RTCRtpCodecParameters
from aiortc.codecs import get_encoder

from media.audio_format import FRAME_MS
from media.opus_voice import VoiceOpusEncoder

FRAMES_PER_S = 1000 // FRAME_MS  # one packet per frame


class AudioFrameSource(Protocol):
    """A track that yields decoded audio frames (the agent's OutboundAudioTrack)."""

    async def recv(self) -> av.AudioFrame: ...

    def stop(self) -> None: ...


class FrameEncoder(Protocol):
    """What the track asks of an encoder (aiortc's Encoder.encode, VoiceOpusEncoder's)."""

    def encode(self, frame: av.AudioFrame,
               force_keyframe: bool = False) -> tuple[list[bytes], int]: ...


def encoder_for(codec: RTCRtpCodecParameters) -> FrameEncoder:
    """The voice's own Opus encoder, or aiortc's for another codec."""
    if codec.name.lower() == "opus":
        return VoiceOpusEncoder()
    encoder: FrameEncoder = get_encoder(codec)
    return encoder


class EncodedAudioTrack(MediaStreamTrack):
    """Packets of `source`'s frames, encoded for the codec `codec()` names once the call has
    negotiated one (it is asked at the first frame)."""

    kind = "audio"

    def __init__(self, source: AudioFrameSource,
                 codec: Callable[[], RTCRtpCodecParameters | None]) -> None:
        super().__init__()
        self.source = source
        self._codec = codec
        self._encoder: FrameEncoder | None = None
        self._time_base = fractions.Fraction(1, 1)
        self._step = 0  # timestamp units between two packets of one frame
        self._ready: deque[av.Packet] = deque()

    @property
    def encoder(self) -> FrameEncoder | None:
        """The encoder in use (None before the first frame)."""
        return self._encoder

    async def recv(self) -> av.Packet:
        """The next packet: the source's next frame, encoded (paced by the source)."""
        while not self._ready:
            self._encode(await self.source.recv())
        return self._ready.popleft()

    def stop(self) -> None:
        super().stop()
        self.source.stop()

    def _encode(self, frame: av.AudioFrame) -> None:
        encoder = self._encoder or self._start()
        payloads, timestamp = encoder.encode(frame)
        for n, payload in enumerate(payloads):  # one per 20 ms frame; more only if buffered
            packet = av.Packet(payload)
            packet.pts = timestamp + n * self._step
            packet.time_base = self._time_base
            self._ready.append(packet)

    def _start(self) -> FrameEncoder:
        codec = self._codec()
        if codec is None:
            raise RuntimeError("outgoing audio before the call negotiated a codec")
        self._encoder = encoder_for(codec)
        self._time_base = fractions.Fraction(1, codec.clockRate)
        self._step = codec.clockRate // FRAMES_PER_S
        return self._encoder
