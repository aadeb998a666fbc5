"""InboundAudio on real decoder output (aiortc's Opus and G.711 codecs, MediaPlayer on a WAV)."""

from __future__ import annotations

import fractions

import av
import numpy as np
import pytest
from aiortc import MediaStreamTrack
from aiortc.codecs.g711 import PcmuDecoder, PcmuEncoder
from aiortc.codecs.opus import OpusDecoder, OpusEncoder
from aiortc.contrib.media import MediaPlayer
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError

from media.audio_format import FRAME_SAMPLES
from media.inbound import InboundAudio
from tests.audio_fixtures import read_wav, speech_wav

TEXT = "Testing the inbound audio path, one two three."


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[int, np.ndarray]:
    """The same speech at 48, 16 and 8 kHz (mono int16), each resampled by sox from one take."""
    folder = tmp_path_factory.mktemp("inbound")
    out = {}
    for rate in (48_000, 16_000, 8_000):
        pcm, got = read_wav(speech_wav(TEXT, folder / f"{rate}.wav", rate=rate,
                                       pad_before_s=0.2, pad_after_s=0.3))
        assert got == rate
        out[rate] = pcm
    return out


class FrameTrack(MediaStreamTrack):
    """A remote-like audio track: returns the given decoded frames, then ends."""

    kind = "audio"

    def __init__(self, frames: list[av.AudioFrame]) -> None:
        super().__init__()
        self._frames = list(frames)

    async def recv(self) -> av.AudioFrame:
        if not self._frames:
            self.stop()
            raise MediaStreamError
        return self._frames.pop(0)


def through_codec(
    pcm: np.ndarray, rate: int, encoder: object, decoder: object
) -> list[av.AudioFrame]:
    """Encode mono PCM in 20 ms frames and decode it again, as aiortc's receiver would."""
    step = rate // 50
    decoded = []
    for n, begin in enumerate(range(0, len(pcm) - step + 1, step)):
        frame = av.AudioFrame.from_ndarray(pcm[begin:begin + step].reshape(1, -1),
                                           format="s16", layout="mono")
        frame.sample_rate = rate
        frame.pts = n * step
        frame.time_base = fractions.Fraction(1, rate)
        payloads, timestamp = encoder.encode(frame)  # type: ignore[attr-defined]
        for payload in payloads:
            decoded += decoder.decode(JitterFrame(payload, timestamp))  # type: ignore[attr-defined]
    return decoded


def opus_frames(pcm48: np.ndarray) -> list[av.AudioFrame]:
    return through_codec(pcm48, 48_000, OpusEncoder(), OpusDecoder())


def pcmu_frames(pcm8: np.ndarray) -> list[av.AudioFrame]:
    return through_codec(pcm8, 8_000, PcmuEncoder(), PcmuDecoder())


async def drain(track: MediaStreamTrack, on_frame: object = None) -> tuple[InboundAudio, list]:
    frames: list[np.ndarray] = []

    def collect(frame: np.ndarray) -> None:
        frames.append(frame.copy())
        if on_frame is not None:
            on_frame(frame)  # type: ignore[operator]

    inbound = InboundAudio(track, collect)
    await inbound.run()
    return inbound, frames


def best_correlation(got: np.ndarray, ref: np.ndarray, max_lag: int = 800) -> float:
    """Highest normalised correlation of `got` against `ref` over lags up to 50 ms."""
    n = min(len(got), len(ref)) - max_lag
    a = ref[:n].astype(np.float64)
    best = 0.0
    for lag in range(-max_lag, max_lag + 1, 1):
        b = got[max(lag, 0):max(lag, 0) + n].astype(np.float64)
        a_part = a[max(-lag, 0):max(-lag, 0) + len(b)]
        b = b[:len(a_part)]
        denom = np.linalg.norm(a_part) * np.linalg.norm(b)
        if denom:
            best = max(best, float(a_part @ b / denom))
    return best


def check_frames(frames: list[np.ndarray]) -> np.ndarray:
    assert frames
    for frame in frames:
        assert frame.dtype == np.int16 and frame.shape == (FRAME_SAMPLES,)
    return np.concatenate(frames)


async def test_opus_stereo_48k_becomes_16k_mono_frames(clips: dict[int, np.ndarray]) -> None:
    decoded = opus_frames(clips[48_000])
    assert decoded[0].layout.name == "stereo" and decoded[0].sample_rate == 48_000
    inbound, frames = await drain(FrameTrack(decoded))

    audio = check_frames(frames)
    assert inbound.frames_in == len(decoded)
    assert inbound.frames_out == len(frames)
    expected = sum(f.samples for f in decoded) // 3
    assert expected - 2 * FRAME_SAMPLES <= len(audio) <= expected
    assert best_correlation(audio, clips[16_000]) > 0.9


async def test_pcmu_mono_8k_becomes_16k_mono_frames(clips: dict[int, np.ndarray]) -> None:
    decoded = pcmu_frames(clips[8_000])
    assert decoded[0].layout.name == "mono" and decoded[0].sample_rate == 8_000
    inbound, frames = await drain(FrameTrack(decoded))

    audio = check_frames(frames)
    assert inbound.frames_in == len(decoded)
    expected = sum(f.samples for f in decoded) * 2
    assert expected - 2 * FRAME_SAMPLES <= len(audio) <= expected
    assert best_correlation(audio, clips[16_000]) > 0.9


async def test_a_codec_change_mid_call_keeps_the_timeline(clips: dict[int, np.ndarray]) -> None:
    opus = opus_frames(clips[48_000])
    pcmu = pcmu_frames(clips[8_000])
    inbound, frames = await drain(FrameTrack(opus + pcmu))

    audio = check_frames(frames)
    assert inbound.frames_in == len(opus) + len(pcmu)
    expected = sum(f.samples for f in opus) // 3 + sum(f.samples for f in pcmu) * 2
    assert expected - 2 * FRAME_SAMPLES <= len(audio) <= expected
    half = sum(f.samples for f in opus) // 3
    assert best_correlation(audio[:half], clips[16_000]) > 0.9
    assert best_correlation(audio[half:], clips[16_000]) > 0.9


async def test_a_failing_consumer_does_not_stop_the_draining(
    clips: dict[int, np.ndarray],
) -> None:
    decoded = pcmu_frames(clips[8_000])
    calls = 0

    def flaky(frame: np.ndarray) -> None:
        nonlocal calls
        calls += 1
        if calls % 3 == 0:
            raise RuntimeError("consumer failed")

    inbound, frames = await drain(FrameTrack(decoded), flaky)
    assert inbound.frames_in == len(decoded)
    assert calls == len(frames) == inbound.frames_out
    assert len(frames) * FRAME_SAMPLES >= sum(f.samples for f in decoded) * 2 - 2 * FRAME_SAMPLES


async def test_media_player_wav_track(tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("player")
    path = speech_wav("one two", folder / "stereo.wav", rate=48_000,
                      pad_before_s=0.1, pad_after_s=0.1, channels=2)
    stereo, _ = read_wav(path)
    assert stereo.shape[1] == 2
    reference, _ = read_wav(speech_wav("one two", folder / "mono16k.wav", rate=16_000,
                                       pad_before_s=0.1, pad_after_s=0.1))
    player = MediaPlayer(str(path))
    inbound, frames = await drain(player.audio)

    audio = check_frames(frames)
    expected = len(stereo) // 3
    assert expected - 3 * FRAME_SAMPLES <= len(audio) <= expected
    assert inbound.frames_in > 0
    assert best_correlation(audio, reference) > 0.9


def onset_frames(rate: int, silent: int, loud: int) -> list[av.AudioFrame]:
    """`silent` 20 ms frames of zeros, then `loud` of a 400 Hz tone at -12 dBFS (mono s16)."""
    step = rate // 50
    t = np.arange(loud * step) / rate
    pcm = np.concatenate([np.zeros(silent * step),
                          np.sin(2 * np.pi * 400 * t) * 8000]).astype(np.int16)
    frames = []
    for n in range(silent + loud):
        frame = av.AudioFrame.from_ndarray(pcm[n * step:(n + 1) * step].reshape(1, -1),
                                           format="s16", layout="mono")
        frame.sample_rate, frame.pts = rate, n * step
        frame.time_base = fractions.Fraction(1, rate)
        frames.append(frame)
    return frames


@pytest.mark.parametrize("rate", [48_000, 8_000])
async def test_each_frame_is_handed_on_with_the_frame_it_came_in(rate: int) -> None:
    """The 16 kHz frame made of input frame n is handed on as frame n, not a frame later: the
    resampler's first output is short of a frame, and carrying the rest would hold every later
    frame (and so the VAD's every decision) back by 19 ms."""
    frames = onset_frames(rate, silent=10, loud=5)
    out: list[tuple[int, float]] = []
    track = FrameTrack(frames)
    inbound = InboundAudio(track, lambda f: out.append(
        (inbound.frames_in, float(np.sqrt(np.mean(f.astype(np.float64) ** 2))))))
    await inbound.run()
    by_input = dict(out)  # input frames read when each output frame was handed on
    tone_rms = 8000 / np.sqrt(2)
    assert by_input[10] < 0.05 * tone_rms  # the last silent frame, as it came in
    loud_first = [rms for n, rms in out if n == 11]  # made as the first loud frame came in
    assert loud_first and loud_first[0] > 0.8 * tone_rms, out[8:13]
