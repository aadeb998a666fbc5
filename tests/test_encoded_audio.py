"""The call's outgoing packets (media/encoded_audio.py): silence after the encoder has settled
is sent as its own repeated bytes, unencoded, and the stream is the one encoding every frame
gives: the same timestamps and silent packets, and audio that decodes the same (G.711: the
same bytes; Opus: its rate control, having seen fewer frames, codes the first spoken frames
after a long silence a little differently)."""

from __future__ import annotations

import asyncio
from collections import Counter
from itertools import pairwise

import av
import numpy as np
import pytest
from aiortc import RTCRtpCodecParameters
from aiortc.codecs import get_decoder, get_encoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError

from media.encoded_audio import SETTLE_FRAMES, EncodedAudioTrack
from media.outbound import FRAME_SAMPLES, SAMPLE_RATE, TIME_BASE

CODECS = {
    "opus": RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48_000, channels=2,
                                  payloadType=111),
    "pcmu": RTCRtpCodecParameters(mimeType="audio/PCMU", clockRate=8_000, channels=1,
                                  payloadType=0),
}
# Frames of the script: silence, a spoken stretch, a long silence, speech again.
SCRIPT = (("silence", 12), ("speech", 30), ("silence", 40), ("speech", 30), ("silence", 8))


def script_frames() -> list[np.ndarray]:
    """20 ms frames of 48 kHz int16: zeros for silence, a gliding two-tone voice for speech."""
    frames: list[np.ndarray] = []
    t = 0
    for kind, count in SCRIPT:
        for _ in range(count):
            n = np.arange(t, t + FRAME_SAMPLES)
            voice = np.sin(2 * np.pi * (180 + n / 400) * n / SAMPLE_RATE) \
                + 0.4 * np.sin(2 * np.pi * 1_300 * n / SAMPLE_RATE)
            pcm = (voice * 9_000).astype(np.int16) if kind == "speech" \
                else np.zeros(FRAME_SAMPLES, np.int16)
            frames.append(pcm)
            t += FRAME_SAMPLES
    return frames


def audio_frame(pcm: np.ndarray, index: int) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = SAMPLE_RATE
    frame.pts = index * FRAME_SAMPLES
    frame.time_base = TIME_BASE
    return frame


class ScriptSource:
    """The frames of the script, one per recv(), as the outbound track hands them over."""

    def __init__(self, frames: list[np.ndarray]) -> None:
        self._frames = iter(enumerate(frames))

    async def recv(self) -> av.AudioFrame:
        for index, pcm in self._frames:
            return audio_frame(pcm, index)
        raise MediaStreamError  # the script ran out, as a stopped track ends

    def stop(self) -> None:
        pass


async def track_packets(codec: RTCRtpCodecParameters,
                        frames: list[np.ndarray]) -> tuple[list[av.Packet], EncodedAudioTrack]:
    track = EncodedAudioTrack(ScriptSource(frames), lambda: codec)
    packets = []
    try:
        while True:
            packets.append(await track.recv())
    except MediaStreamError:
        pass
    return packets, track


def every_frame_encoded(codec: RTCRtpCodecParameters,
                        frames: list[np.ndarray]) -> list[tuple[int, bytes]]:
    """The reference: aiortc's encoder given every frame."""
    encoder = get_encoder(codec)
    out: list[tuple[int, bytes]] = []
    step = codec.clockRate * FRAME_SAMPLES // SAMPLE_RATE
    for index, pcm in enumerate(frames):
        payloads, timestamp = encoder.encode(audio_frame(pcm, index))
        out += [(timestamp + n * step, payload) for n, payload in enumerate(payloads)]
    return out


def decoded(codec: RTCRtpCodecParameters, stream: list[tuple[int, bytes]]) -> np.ndarray:
    """The stream as the caller's aiortc decodes it (the first channel)."""
    decoder = get_decoder(codec)
    pcm = [frame.to_ndarray()[0, ::len(frame.layout.channels)]
           for timestamp, payload in stream
           for frame in decoder.decode(JitterFrame(data=payload, timestamp=timestamp))]
    return np.concatenate(pcm).astype(np.float64)


@pytest.mark.parametrize("name", list(CODECS))
def test_silence_is_sent_unencoded_and_the_stream_is_unchanged(name: str) -> None:
    codec = CODECS[name]
    frames = script_frames()
    packets, track = asyncio.run(track_packets(codec, frames))
    sent = [(int(p.pts), bytes(p)) for p in packets]
    reference = every_frame_encoded(codec, frames)

    assert [ts for ts, _ in sent] == [ts for ts, _ in reference]
    step = codec.clockRate * FRAME_SAMPLES // SAMPLE_RATE
    assert all(b - a == step for (a, _), (b, _) in pairwise(sent))
    # The encoder's settled silence (its commonest packet) goes out at the same places.
    silence = Counter(payload for _, payload in reference).most_common(1)[0][0]
    assert [n for n, (_, payload) in enumerate(sent) if payload == silence] \
        == [n for n, (_, payload) in enumerate(reference) if payload == silence]
    # Each silence went unencoded past its settling frames (one or two more where the encoder's
    # first silent bytes still carried the speech in its lookahead); speech never did.
    silences = [count for kind, count in SCRIPT if kind == "silence"]
    settled = sum(count - SETTLE_FRAMES for count in silences)
    assert settled - 2 * len(silences) <= track.frames_skipped <= settled
    heard, continuous = decoded(codec, sent), decoded(codec, reference)
    snr_db = 10 * np.log10(np.sum(continuous**2) / max(np.sum((heard - continuous)**2), 1e-9))
    assert snr_db > 40
