"""The light caller of `omnivox bench calls --callers light`: a caller that costs far less CPU than
the call it places, so one machine can hold many more of them beside the server.

A full caller (agent/bench/caller.py) encodes its voice frame by frame and decodes every reply
frame to find its loud samples. A light one does neither:

- it speaks Opus packets encoded once per utterance and process (`PacketCache`), handed to
  aiortc's sender on a 20 ms clock (aiortc only packs a pre-encoded packet), with the encoder's
  packet of digital silence between utterances;
- it hears the reply from its RTP packets' sizes, without a jitter buffer or a decoder: the
  server's pacer sends digital silence between replies, which Opus codes as a packet of a few
  bytes (`SILENT_MAX_BYTES`), while any sound takes tens to hundreds. A packet is then all sound
  or all silence: the light caller's times have a 20 ms resolution, and a reply's quiet tail
  (samples a full caller would count as silence) counts as sound. So does the voice's silence
  just after a cut: the voice's encoder codes the first 13 frames of digital silence after
  sound in over 200 bytes each (libopus spending on the decay) before its 3-byte packet, so a
  light caller's barge-in stop counts about 260 ms more than a full caller hears
  (docs/measurements/2026-12-06-barge-in.md): time barge-ins with full callers.

Opus only: a light caller offers no other codec.
"""

from __future__ import annotations

import fractions
import time
from collections import deque
from collections.abc import Callable

import av
import numpy as np
from aiortc import MediaStreamTrack, RTCRtpCodecParameters
from aiortc.codecs import get_encoder
from aiortc.mediastreams import MediaStreamError
from aiortc.rtp import RtpPacket

from agent.bench.caller import BenchCaller, Heard
from agent.bench.microphone import MIC_FRAME, FrameClock, Utterance
from agent.bench.speech import MIC_RATE
from media.aiortc_internals import take_rtp_packets

OPUS_RATE = 48_000
FRAME_S = 0.02
SILENT_MAX_BYTES = 8  # libopus codes 20 ms of digital silence in 3 bytes
_OPUS = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=OPUS_RATE, channels=2,
                              payloadType=111)
_TIME_BASE = fractions.Fraction(1, OPUS_RATE)


def encode_opus(pcm: np.ndarray) -> tuple[bytes, ...]:
    """16 kHz mono int16 speech as 20 ms Opus packets (aiortc's encoder, as a caller's would)."""
    encoder = get_encoder(_OPUS)
    frames = -(-len(pcm) // MIC_FRAME)
    padded = np.zeros((frames + 2) * MIC_FRAME, np.int16)  # 2 more: the resampler's delay
    padded[:len(pcm)] = pcm
    packets: list[bytes] = []
    for index in range(frames + 2):
        frame = av.AudioFrame.from_ndarray(
            padded[index * MIC_FRAME:(index + 1) * MIC_FRAME].reshape(1, -1), format="s16",
            layout="mono")
        frame.sample_rate, frame.pts = MIC_RATE, index * MIC_FRAME
        frame.time_base = fractions.Fraction(1, MIC_RATE)
        packets += encoder.encode(frame)[0]
    return tuple(packets[:frames])


class PacketCache:
    """Each utterance encoded once per process, whichever caller says it first."""

    def __init__(self) -> None:
        self._packets: dict[int, tuple[np.ndarray, tuple[bytes, ...]]] = {}
        self.silence = encode_opus(np.zeros(MIC_FRAME * 4, np.int16))[-1]

    def packets(self, pcm: np.ndarray) -> tuple[bytes, ...]:
        """`pcm`'s packets; the array is kept, so its id names it for as long as this lives."""
        kept = self._packets.get(id(pcm))
        if kept is None:
            kept = self._packets[id(pcm)] = (pcm, encode_opus(pcm))
        return kept[1]


_cache: PacketCache | None = None


def packet_cache() -> PacketCache:
    global _cache
    if _cache is None:
        _cache = PacketCache()
    return _cache


class PacketMicrophone(MediaStreamTrack):
    """The light caller's voice: pre-encoded Opus packets on an absolute 20 ms clock, the
    utterance's or silence's; `on_edge(True/False, at)` when speech starts or ends, `at` the
    edge's frame's due time."""

    kind = "audio"

    def __init__(self, on_edge: Callable[[bool, float], None], silence: bytes) -> None:
        super().__init__()
        self.on_edge = on_edge
        self.silence = silence
        self._pending: deque[bytes] = deque()
        self._speaking = False
        self._clock = FrameClock()

    def say(self, packets: tuple[bytes, ...]) -> None:
        """Send `packets` from the next frame on, after whatever is still being said."""
        self._pending.extend(packets)

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        index = await self._clock.tick()
        payload = self._pending.popleft() if self._pending else None
        if payload is not None and not self._speaking:
            self._speaking = True
            self.on_edge(True, self._clock.due)
        elif payload is None and self._speaking:
            self._speaking = False
            self.on_edge(False, self._clock.due)
        packet = av.Packet(payload or self.silence)
        packet.pts, packet.time_base = index * (OPUS_RATE // 50), _TIME_BASE
        return packet


class LightCaller(BenchCaller):
    """A `BenchCaller` that neither encodes nor decodes audio (see the module's docstring)."""

    def __init__(self, base_url: str, api_key: str | None = None,
                 codec: str | None = None) -> None:
        if codec not in (None, "opus"):
            raise ValueError(f"a light caller speaks Opus only, not {codec}")
        super().__init__(base_url, api_key, "opus")
        self.cache = packet_cache()
        self.mic = PacketMicrophone(self._mic_changed, self.cache.silence)  # type: ignore[assignment]

    async def say(self, pcm: np.ndarray, sample_rate: int) -> Utterance:
        if sample_rate != MIC_RATE:  # the bench's utterances are made at this rate
            raise ValueError(f"a light caller says {MIC_RATE} Hz speech, not {sample_rate} Hz")
        packets = self.cache.packets(pcm)
        self.utterance = Utterance(len(pcm))
        self.speech_ended_at = self.first_audio_at = None
        self.mic.say(packets)  # type: ignore[arg-type]
        return self.utterance

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio":
            return
        receiver = next(t.receiver for t in self.pc.getTransceivers()
                        if t.receiver.track is track)
        take_rtp_packets(receiver, self._packet)

    def _packet(self, packet: RtpPacket) -> None:
        at = time.monotonic()
        if self._rtp_origin is None:
            self._rtp_origin = packet.timestamp
        media = ((packet.timestamp - self._rtp_origin) & 0xFFFFFFFF) / OPUS_RATE
        loud = len(packet.payload) > SILENT_MAX_BYTES
        self._note_heard(Heard(at, media, FRAME_S, 0.0 if loud else None,
                               FRAME_S if loud else None))
