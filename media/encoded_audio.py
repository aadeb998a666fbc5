"""The agent's audio handed to aiortc already encoded, in the event loop, with aiortc's encoder.

Given a decoded frame, aiortc's sender first computes the frame's RTP audio level, then sends
the frame to a thread pool to be encoded and waits for the result. Under a profile of 16 calls,
that round trip (a submit, a pool thread woken, the result handed back to the loop) cost the
API process about 14% of its CPU, more than the encoding itself (4%). Given an `av.Packet`, the
sender only packs it. So this track encodes each frame of its source where the frame is made,
with aiortc's own encoder for the codec the call negotiated, and sends no audio level.

Most of a call's outgoing frames are silence (the agent listens far more than it speaks), and
encoding a silent Opus frame costs about as much as half a spoken one. Once the encoder has
coded SETTLE_FRAMES silent frames in a row (its lookahead and filter memories then hold only
zeros, the state it would keep through any longer silence) and has given the same bytes for the
last two, the track repeats those bytes for each further silent frame without calling it. The
receiver gets the bytes continuous encoding would have given it during the silence; the next
spoken frame goes to the same encoder. G.711 then sends the very same stream; Opus's first
spoken frames after a long silence differ a little (its rate control and signal analysis saw
fewer frames) and decode to within about 50 dB of continuous encoding (tests/test_encoded_audio.py).
"""

from __future__ import annotations

import fractions
from collections import deque
from collections.abc import Callable
from typing import Protocol

import av
from aiortc import MediaStreamTrack, RTCRtpCodecParameters
from aiortc.codecs import get_encoder
from aiortc.codecs.base import Encoder

from media.audio_format import FRAME_MS

FRAMES_PER_S = 1000 // FRAME_MS  # one packet per frame
# Silent frames coded in a row before the encoder's silence bytes are repeated instead: enough
# to push the last spoken samples out of Opus's 6.5 ms lookahead and its filters' memories.
SETTLE_FRAMES = 3


class AudioFrameSource(Protocol):
    """A track that yields decoded audio frames (the agent's OutboundAudioTrack)."""

    async def recv(self) -> av.AudioFrame: ...

    def stop(self) -> None: ...


class EncodedAudioTrack(MediaStreamTrack):
    """Packets of `source`'s frames, encoded for the codec `codec()` names once the call has
    negotiated one (it is asked at the first frame)."""

    kind = "audio"

    def __init__(self, source: AudioFrameSource,
                 codec: Callable[[], RTCRtpCodecParameters | None]) -> None:
        super().__init__()
        self.source = source
        self._codec = codec
        self._encoder: Encoder | None = None
        self._time_base = fractions.Fraction(1, 1)
        self._step = 0  # timestamp units between two packets of one frame
        self._ready: deque[av.Packet] = deque()
        self._silent_run = 0  # silent frames in a row handed to the encoder
        self._last_payloads: list[bytes] = []  # what the encoder gave for the last frame
        self._silence: bytes | None = None  # the settled encoder's bytes for a silent frame
        # Packets are stamped by their count, one per frame: the encoder's own stamps count
        # only the samples it was given, and lose step once frames are skipped.
        self._packets = 0
        self._frames_skipped = 0

    @property
    def encoder(self) -> Encoder | None:
        """aiortc's encoder in use (None before the first frame)."""
        return self._encoder

    @property
    def frames_skipped(self) -> int:
        """Silent frames sent as the settled encoder's repeated bytes, not encoded."""
        return self._frames_skipped

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
        silent = not frame.to_ndarray().any()
        if silent and self._silence is not None:
            self._frames_skipped += 1
            self._queue([self._silence])
            return
        self._silent_run = self._silent_run + 1 if silent else 0
        if not silent:
            self._silence = None
        payloads, _ = encoder.encode(frame)
        if not payloads:  # buffered (a resampler's first frame): nothing to send yet
            return
        if self._silent_run >= SETTLE_FRAMES and len(payloads) == 1 \
                and payloads == self._last_payloads:
            self._silence = payloads[0]
        self._last_payloads = payloads
        self._queue(payloads)

    def _queue(self, payloads: list[bytes]) -> None:
        for payload in payloads:  # one per 20 ms frame; more only if buffered
            packet = av.Packet(payload)
            packet.pts = self._packets * self._step
            packet.time_base = self._time_base
            self._packets += 1
            self._ready.append(packet)

    def _start(self) -> Encoder:
        codec = self._codec()
        if codec is None:
            raise RuntimeError("outgoing audio before the call negotiated a codec")
        self._encoder = get_encoder(codec)
        self._time_base = fractions.Fraction(1, codec.clockRate)
        self._step = codec.clockRate // FRAMES_PER_S
        return self._encoder
