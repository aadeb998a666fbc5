"""Opus for voices: the agent's coded mono, CELT only, at a voice's bitrate, without
resampling; the caller's decoded to mono.

aiortc's own Opus encoder passes every frame through a resampler to stereo (a filter graph and
a FIFO) and codes it at 96 kbit/s in libopus's voip mode at complexity 10. The agent's voice
is mono (media/outbound.py makes 48 kHz mono frames of 20 ms), so none of that buys sound the
caller could hear. In CPU time on this machine, a spoken 20 ms frame cost 205 us with aiortc's
encoder and 89 us with this one, a silent frame 107 and 46 us. Every call pays it 50 times a
second, silence included, in the event loop (media/encoded_audio.py).

libopus's restricted low-delay mode codes with CELT alone: 2.5 ms less look-ahead than the
voip mode, and 20 ms of digital silence in 3 bytes, which `omnivox bench calls`' light callers
rely on to tell silence from speech without decoding (agent/bench/light_caller.py); the voip
mode took 55 bytes for it at this bitrate. Coding it still cost 46 us a frame, and a call is
mostly the agent's silence (it listens, then thinks), so once the encoder has coded it to the
same packet SILENCE_SETTLED times in a row, that packet is sent again for each further frame of
it without coding: CELT keeps no state from a silent frame that the caller's decoder and the
encoder would need to share (its band energies are reset on both sides), so the voice after it
decodes as cleanly (tests/test_opus_voice.py), and Chromium hears it (tests/test_browser_agent.py).
An earlier try at this, with aiortc's voip-mode encoder (SILK, whose frames do depend on each
other), left Chromium hearing nothing.

aiortc's Opus decoder gives stereo, which the inbound path (media/inbound.py) then mixes down
to the VAD's 16 kHz mono: decoding to mono in libopus costs less (27 against 36 us a frame
here) and leaves the resampler half the samples. A stereo caller is mixed down by libopus.
"""

from __future__ import annotations

import fractions

import av
import numpy as np
from aiortc.codecs.base import Decoder
from aiortc.jitterbuffer import JitterFrame
from av.frame import Frame

from media.outbound import FRAME_SAMPLES, SAMPLE_RATE

BITRATE = 48_000  # bit/s: fullband mono speech (aiortc sends 96,000 for stereo)
COMPLEXITY = 5  # libopus 0-10: 10 cost 113 us a spoken frame here, for a voice
RTP_CLOCK = 48_000  # Opus over RTP always counts 48 kHz (RFC 7587), whatever was coded
RTP_STEP = RTP_CLOCK * FRAME_SAMPLES // SAMPLE_RATE  # 960 per 20 ms packet
_RTP_TIME_BASE = fractions.Fraction(1, RTP_CLOCK)
# Digital silence coded to this many identical packets in a row has settled (the tail of the
# voice before it is gone): the packet is sent again for more of it, without coding the frame.
SILENCE_SETTLED = 5


class VoiceOpusEncoder:
    """One call's Opus encoder: the outbound track's mono int16 frames in, one packet out per
    frame, stamped by its count on the RTP clock."""

    def __init__(self, bitrate: int = BITRATE, complexity: int = COMPLEXITY,
                 reuse_silence: bool = True) -> None:
        codec = av.CodecContext.create("libopus", "w")
        assert isinstance(codec, av.AudioCodecContext)
        codec.bit_rate = bitrate
        codec.format = "s16"
        codec.layout = "mono"
        codec.sample_rate = SAMPLE_RATE
        codec.time_base = fractions.Fraction(1, SAMPLE_RATE)
        codec.options = {"application": "lowdelay", "compression_level": str(complexity),
                         "frame_duration": "20"}
        codec.open()
        self.codec = codec
        self._packets = 0  # sent so far: the next packet's timestamp is this many steps
        self._reuse_silence = reuse_silence
        self._silent: bytes | None = None  # the last packet coded from digital silence
        self._silent_run = 0  # identical packets of it in a row
        self.reused = 0  # silent frames sent as the settled packet, not coded

    def encode(self, frame: av.AudioFrame,
               force_keyframe: bool = False) -> tuple[list[bytes], int]:
        """The frame's packet(s) and the first one's RTP timestamp (aiortc's Encoder call)."""
        if (frame.sample_rate, frame.samples, frame.layout.name, frame.format.name) != (
                SAMPLE_RATE, FRAME_SAMPLES, "mono", "s16"):
            raise ValueError(f"the voice's Opus encoder takes {FRAME_SAMPLES} samples of "
                             f"{SAMPLE_RATE} Hz mono s16, got {frame.samples} of "
                             f"{frame.sample_rate} Hz {frame.layout.name} {frame.format.name}")
        silent = not np.frombuffer(memoryview(frame.planes[0]), np.int16, FRAME_SAMPLES).any()
        if silent and self._silent is not None and self._silent_run >= SILENCE_SETTLED:
            payloads = [self._silent]
            self.reused += 1
        else:
            payloads = [bytes(packet) for packet in self.codec.encode(frame)]
            self._count_silence(silent, payloads)
        timestamp = self._packets * RTP_STEP
        self._packets += len(payloads)
        return payloads, timestamp

    def _count_silence(self, silent: bool, payloads: list[bytes]) -> None:
        if not (silent and self._reuse_silence and len(payloads) == 1):
            self._silent, self._silent_run = None, 0
        elif payloads[0] == self._silent:
            self._silent_run += 1
        else:
            self._silent, self._silent_run = payloads[0], 1


class VoiceOpusDecoder(Decoder):
    """One caller's Opus decoder: packets in, 48 kHz mono s16 frames out."""

    def __init__(self) -> None:
        codec = av.CodecContext.create("libopus", "r")
        assert isinstance(codec, av.AudioCodecContext)
        codec.format = "s16"
        codec.layout = "mono"
        codec.sample_rate = SAMPLE_RATE
        self.codec = codec

    def decode(self, encoded_frame: JitterFrame) -> list[Frame]:
        packet = av.Packet(encoded_frame.data)
        packet.pts = encoded_frame.timestamp
        packet.time_base = _RTP_TIME_BASE
        return list(self.codec.decode(packet))

