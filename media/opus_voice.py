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
mode took 55 bytes for it at this bitrate.

aiortc's Opus decoder gives stereo, which the inbound path (media/inbound.py) then mixes down
to the VAD's 16 kHz mono: decoding to mono in libopus costs less (27 against 36 us a frame
here) and leaves the resampler half the samples. A stereo caller is mixed down by libopus.
"""

from __future__ import annotations

import fractions

import av
from aiortc.codecs.base import Decoder
from aiortc.jitterbuffer import JitterFrame
from av.frame import Frame

from media.outbound import FRAME_SAMPLES, SAMPLE_RATE

BITRATE = 48_000  # bit/s: fullband mono speech (aiortc sends 96,000 for stereo)
COMPLEXITY = 5  # libopus 0-10: 10 cost 113 us a spoken frame here, for a voice
RTP_CLOCK = 48_000  # Opus over RTP always counts 48 kHz (RFC 7587), whatever was coded
RTP_STEP = RTP_CLOCK * FRAME_SAMPLES // SAMPLE_RATE  # 960 per 20 ms packet


class VoiceOpusEncoder:
    """One call's Opus encoder: the outbound track's mono int16 frames in, one packet out per
    frame, stamped by its count on the RTP clock."""

    def __init__(self, bitrate: int = BITRATE, complexity: int = COMPLEXITY) -> None:
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

    def encode(self, frame: av.AudioFrame,
               force_keyframe: bool = False) -> tuple[list[bytes], int]:
        """The frame's packet(s) and the first one's RTP timestamp (aiortc's Encoder call)."""
        if (frame.sample_rate, frame.samples, frame.layout.name, frame.format.name) != (
                SAMPLE_RATE, FRAME_SAMPLES, "mono", "s16"):
            raise ValueError(f"the voice's Opus encoder takes {FRAME_SAMPLES} samples of "
                             f"{SAMPLE_RATE} Hz mono s16, got {frame.samples} of "
                             f"{frame.sample_rate} Hz {frame.layout.name} {frame.format.name}")
        payloads = [bytes(packet) for packet in self.codec.encode(frame)]
        timestamp = self._packets * RTP_STEP
        self._packets += len(payloads)
        return payloads, timestamp


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


_RTP_TIME_BASE = fractions.Fraction(1, RTP_CLOCK)
