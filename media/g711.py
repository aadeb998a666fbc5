"""G.711, the telephone network's audio: 8 kHz, one byte a sample, μ-law (`pcmu`) or A-law
(`pcma`). FFmpeg's codecs (`pcm_mulaw`, `pcm_alaw`) through PyAV convert it to and from mono
int16. (aiortp's own G.711, which the SIP bridge's RTP stack carries, is not used here: its
A-law has the sign bit inverted against ITU-T G.711, FFmpeg and the stdlib's audioop.)"""

from __future__ import annotations

from typing import Literal

import av
import numpy as np

RATE = 8_000  # Hz: G.711 is narrowband, whatever carries it
Law = Literal["pcmu", "pcma"]
_CODECS: dict[Law, str] = {"pcmu": "pcm_mulaw", "pcma": "pcm_alaw"}


class G711:
    """One law both ways. The codec is stateless, each byte a sample of its own: any length
    converts, and pieces convert exactly as their whole would."""

    def __init__(self, law: Law) -> None:
        self.law = law
        encoder = av.CodecContext.create(_CODECS[law], "w")
        decoder = av.CodecContext.create(_CODECS[law], "r")
        assert isinstance(encoder, av.AudioCodecContext)
        assert isinstance(decoder, av.AudioCodecContext)
        encoder.sample_rate = decoder.sample_rate = RATE
        encoder.layout = decoder.layout = "mono"
        encoder.format = "s16"
        self._encoder, self._decoder = encoder, decoder

    def encode(self, pcm: np.ndarray) -> bytes:
        """Mono int16 at 8 kHz as G.711 bytes, one a sample."""
        if not len(pcm):
            return b""
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(pcm, dtype=np.int16).reshape(1, -1), format="s16",
            layout="mono")
        frame.sample_rate = RATE
        return b"".join(bytes(packet) for packet in self._encoder.encode(frame))

    def decode(self, payload: bytes) -> np.ndarray:
        """G.711 bytes as mono int16 at 8 kHz, one sample a byte."""
        if not payload:
            return np.zeros(0, np.int16)
        frames = self._decoder.decode(av.Packet(payload))
        pcm: np.ndarray = np.concatenate([f.to_ndarray().reshape(-1) for f in frames])
        return pcm.astype(np.int16, copy=False)
