"""VadSegmenter on real speech (espeak-ng) with known boundaries."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from media.audio_format import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE, SAMPLES_PER_MS
from media.vad import (
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    VadConfig,
    VadEvent,
    VadSegmenter,
    frame_variance,
)
from tests.audio_fixtures import read_wav, speech_bounds, speech_wav

TOLERANCE_MS = 150


class Speech:
    """A padded speech clip at 16 kHz and where its audible part lies."""

    def __init__(self, pcm: np.ndarray) -> None:
        self.pcm = pcm
        self.start_ms, self.end_ms = speech_bounds(pcm, SAMPLE_RATE)


@pytest.fixture(scope="session")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Speech:
    path = speech_wav(
        "Hello there, this is a test of the voice activity detector.",
        tmp_path_factory.mktemp("vad") / "speech.wav",
        rate=SAMPLE_RATE, pad_before_s=1.0, pad_after_s=1.5,
    )
    pcm, rate = read_wav(path)
    assert rate == SAMPLE_RATE and pcm.ndim == 1
    return Speech(pcm)


def frames_of(pcm: np.ndarray) -> list[np.ndarray]:
    padded = np.concatenate([pcm, np.zeros(-len(pcm) % FRAME_SAMPLES, dtype=np.int16)])
    return list(padded.reshape(-1, FRAME_SAMPLES))


def feed(vad: VadSegmenter, pcm: np.ndarray) -> list[tuple[int, VadEvent]]:
    """Push all of `pcm`; returns each event with the timeline position when it was emitted."""
    events = []
    for frame in frames_of(pcm):
        events += [(vad.position_ms, e) for e in vad.push(frame)]
    return events


def silence(ms: int) -> np.ndarray:
    return np.zeros(ms * SAMPLES_PER_MS, dtype=np.int16)


def test_one_utterance_has_the_true_boundaries_and_audio(speech: Speech) -> None:
    config = VadConfig()
    vad = VadSegmenter(config)
    events = feed(vad, speech.pcm)

    # By default a pause (pause_ms, for a preemptive reply) comes before the close.
    assert [type(e) for _, e in events] == [SpeechStarted, SpeechPaused, SpeechStopped]
    (_, started), (paused_at, _), (stopped_at, stopped) = events
    assert paused_at == stopped_at - config.silence_ms + config.pause_ms
    assert abs(started.audio_start_ms - speech.start_ms) <= TOLERANCE_MS
    assert abs(stopped.audio_end_ms - speech.end_ms) <= TOLERANCE_MS
    assert stopped.audio_start_ms == started.audio_start_ms
    assert not stopped.capped
    # The close comes exactly silence_ms after the last voiced frame.
    assert stopped_at == stopped.audio_end_ms + config.silence_ms
    # The utterance is pre-roll + speech, sample-exact against the source.
    first = (stopped.audio_start_ms - config.preroll_ms) * SAMPLES_PER_MS
    last = stopped.audio_end_ms * SAMPLES_PER_MS
    assert stopped.pcm.dtype == np.int16
    np.testing.assert_array_equal(stopped.pcm, speech.pcm[first:last])
    true_len_ms = config.preroll_ms + speech.end_ms - speech.start_ms
    assert abs(len(stopped.pcm) / SAMPLES_PER_MS - true_len_ms) <= TOLERANCE_MS
    assert not vad.in_speech
    assert vad.position_ms == len(frames_of(speech.pcm)) * FRAME_MS


def test_a_pause_carries_the_audio_the_close_then_delivers(speech: Speech) -> None:
    """pause_ms of silence inside an utterance is a SpeechPaused, with the very audio (and
    bounds) of the SpeechStopped that follows when the silence goes on to silence_ms."""
    config = VadConfig(pause_ms=200, silence_ms=500)
    events = feed(VadSegmenter(config), speech.pcm)

    kinds = [type(e) for _, e in events]
    assert kinds[0] is SpeechStarted and kinds[-2:] == [SpeechPaused, SpeechStopped], kinds
    (paused_at, paused), (stopped_at, stopped) = events[-2:]
    assert isinstance(paused, SpeechPaused) and isinstance(stopped, SpeechStopped)
    assert paused_at == paused.audio_end_ms + config.pause_ms
    assert stopped_at == paused_at + config.silence_ms - config.pause_ms
    assert (paused.audio_start_ms, paused.audio_end_ms) == (
        stopped.audio_start_ms, stopped.audio_end_ms)
    np.testing.assert_array_equal(paused.pcm, stopped.pcm)


def test_speech_after_a_pause_resumes_the_utterance(speech: Speech) -> None:
    """A 300 ms gap (above pause_ms, below silence_ms) pauses, then resumes, one utterance."""
    config = VadConfig(pause_ms=200, silence_ms=500)
    voiced = speech.pcm[speech.start_ms * SAMPLES_PER_MS:speech.end_ms * SAMPLES_PER_MS]
    pcm = np.concatenate([silence(500), voiced, silence(300), voiced, silence(800)])
    events = [e for _, e in feed(VadSegmenter(config), pcm)]

    kinds = [type(e) for e in events]
    assert kinds.count(SpeechStarted) == 1 and kinds.count(SpeechStopped) == 1, kinds
    resumed = kinds.index(SpeechResumed)
    assert SpeechPaused in kinds[:resumed], kinds
    first_pause = events[kinds.index(SpeechPaused)]
    stopped = events[-1]
    assert isinstance(first_pause, SpeechPaused) and isinstance(stopped, SpeechStopped)
    # The close covers both halves; the pause had only the first.
    second_half_ms = 300 + len(voiced) // SAMPLES_PER_MS
    assert stopped.audio_end_ms >= first_pause.audio_end_ms + second_half_ms // 2
    assert len(stopped.pcm) > len(first_pause.pcm)


def test_end_now_closes_at_a_pause_and_nowhere_else(speech: Speech) -> None:
    """end_now() (semantic end of turn) closes the utterance at a pause with the audio the
    pause carried; in speech, or outside it, it does nothing."""
    config = VadConfig(pause_ms=200, silence_ms=2000)
    vad = VadSegmenter(config)
    assert vad.end_now() is None  # nothing said yet
    paused = None
    for frame in frames_of(speech.pcm):
        events = vad.push(frame)
        if vad.in_speech and paused is None and not events:
            assert vad.end_now() is None  # speaking, or silent for less than pause_ms
        paused = next((e for e in events if isinstance(e, SpeechPaused)), paused)
        if isinstance(paused, SpeechPaused):
            break
    assert isinstance(paused, SpeechPaused)
    stopped = vad.end_now()
    assert isinstance(stopped, SpeechStopped) and not stopped.capped
    assert (stopped.audio_start_ms, stopped.audio_end_ms) == (
        paused.audio_start_ms, paused.audio_end_ms)
    np.testing.assert_array_equal(stopped.pcm, paused.pcm)
    assert not vad.in_speech and vad.end_now() is None
    # The rest of the clip's silence starts nothing new.
    assert [e for frame in frames_of(silence(1000)) for e in vad.push(frame)] == []


def test_two_utterances_on_one_timeline(speech: Speech) -> None:
    vad = VadSegmenter(VadConfig(pause_ms=0))  # the boundaries alone: pauses have their tests
    offset_ms = len(speech.pcm) // SAMPLES_PER_MS
    events = [e for _, e in feed(vad, np.concatenate([speech.pcm, speech.pcm]))]

    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped] * 2
    second = events[3]
    assert isinstance(second, SpeechStopped)
    assert abs(second.audio_start_ms - (offset_ms + speech.start_ms)) <= TOLERANCE_MS
    assert abs(second.audio_end_ms - (offset_ms + speech.end_ms)) <= TOLERANCE_MS


def test_burst_shorter_than_onset_does_not_start_speech(speech: Speech) -> None:
    config = VadConfig(onset_ms=60, pause_ms=0)  # no pauses: they have their own tests
    # The loudest 40 ms of the clip, frame-aligned, alone in silence.
    frames = frames_of(speech.pcm)
    loudest = int(np.argmax([np.abs(f.astype(np.int32)).sum() for f in frames]))
    burst = np.concatenate(frames[loudest - 1:loudest + 1])
    vad = VadSegmenter(config)
    assert feed(vad, np.concatenate([silence(500), burst, silence(1000)])) == []
    assert not vad.in_speech

    # The same spot held longer than the onset does start speech.
    longer = np.concatenate(frames[loudest - 5:loudest + 5])
    events = feed(VadSegmenter(config), np.concatenate([silence(500), longer, silence(1000)]))
    assert [type(e) for _, e in events] == [SpeechStarted, SpeechStopped]


def test_max_utterance_caps_and_needs_a_fresh_onset(speech: Speech) -> None:
    config = VadConfig(max_utterance_ms=1000)
    vad = VadSegmenter(config)
    events = feed(vad, speech.pcm)

    stops = [e for _, e in events if isinstance(e, SpeechStopped)]
    starts = [(at, e) for at, e in events if isinstance(e, SpeechStarted)]
    speech_ms = speech.end_ms - speech.start_ms
    assert stops[0].capped
    assert stops[0].audio_end_ms - stops[0].audio_start_ms <= config.max_utterance_ms
    assert len(stops[0].pcm) <= (config.max_utterance_ms + config.preroll_ms) * SAMPLES_PER_MS
    # No loop of empty turns: a handful of real utterances, each holding audio.
    assert 2 <= len(stops) <= speech_ms // 1000 + 2
    assert all(len(s.pcm) >= config.onset_ms * SAMPLES_PER_MS for s in stops)
    assert not stops[-1].capped
    for previous, (started_at, started) in zip(stops, starts[1:], strict=False):
        # A new utterance needs a whole new onset after the previous close ...
        assert started_at >= previous.audio_end_ms + config.onset_ms
        assert started.audio_start_ms >= previous.audio_end_ms
    for previous, current in itertools.pairwise(stops):
        # ... and does not repeat audio the previous one already delivered.
        assert len(current.pcm) <= (current.audio_end_ms - previous.audio_end_ms) * SAMPLES_PER_MS


def test_clear_drops_speech_in_progress(speech: Speech) -> None:
    config = VadConfig(pause_ms=0)  # no pauses: they have their own tests
    vad = VadSegmenter(config)
    head = speech.pcm[: (speech.start_ms + 400) * SAMPLES_PER_MS]
    events = feed(vad, head)
    assert [type(e) for _, e in events] == [SpeechStarted]
    assert vad.in_speech

    vad.clear()
    assert not vad.in_speech
    assert feed(vad, silence(1500)) == []

    # The timeline kept counting; the next utterance is whole and carries no cleared audio.
    offset_ms = vad.position_ms
    events = [e for _, e in feed(vad, speech.pcm)]
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]
    stopped = events[1]
    assert isinstance(stopped, SpeechStopped)
    assert abs(stopped.audio_start_ms - (offset_ms + speech.start_ms)) <= TOLERANCE_MS
    assert len(stopped.pcm) == (stopped.audio_end_ms - stopped.audio_start_ms
                                + config.preroll_ms) * SAMPLES_PER_MS


def test_reconfigure_applies_to_the_next_frames(speech: Speech) -> None:
    vad = VadSegmenter(VadConfig(silence_ms=500))
    feed(vad, speech.pcm[: (speech.start_ms + 300) * SAMPLES_PER_MS])
    assert vad.in_speech
    vad.reconfigure(VadConfig(silence_ms=200, aggressiveness=3, preroll_ms=100))
    assert vad.config.silence_ms == 200
    events = feed(vad, speech.pcm[(speech.start_ms + 300) * SAMPLES_PER_MS:])
    stops = [(at, e) for at, e in events if isinstance(e, SpeechStopped)]
    assert stops
    at, stopped = stops[-1]
    assert at == stopped.audio_end_ms + 200


@pytest.mark.parametrize("name, frame", [
    ("digital silence", np.zeros(FRAME_SAMPLES, dtype=np.int16)),
    ("dc offset", np.full(FRAME_SAMPLES, 1200, dtype=np.int16)),
    ("negative full scale", np.full(FRAME_SAMPLES, -32768, dtype=np.int16)),
])
def test_flat_frames_never_start_speech(name: str, frame: np.ndarray) -> None:
    vad = VadSegmenter(VadConfig(aggressiveness=0, onset_ms=20))
    for _ in range(100):
        assert vad.push(frame) == [], name
    assert vad.position_ms == 100 * FRAME_MS


def test_clipping_and_full_scale_noise_do_not_crash() -> None:
    rng = np.random.default_rng(7)
    square = np.where(np.arange(FRAME_SAMPLES) // 20 % 2 == 0, 32767, -32768).astype(np.int16)
    noise = rng.integers(-32768, 32767, FRAME_SAMPLES, endpoint=True, dtype=np.int16)
    vad = VadSegmenter(VadConfig(max_utterance_ms=400))
    events = []
    for frame in [square] * 60 + [noise] * 60 + [np.zeros(FRAME_SAMPLES, np.int16)] * 60:
        events += vad.push(frame)
    for event in events:
        assert isinstance(event, SpeechStarted | SpeechStopped)
    assert not vad.in_speech
    assert vad.position_ms == 180 * FRAME_MS


@pytest.mark.parametrize("bad", [
    np.zeros(FRAME_SAMPLES - 1, dtype=np.int16),
    np.zeros(FRAME_SAMPLES + 1, dtype=np.int16),
    np.zeros(FRAME_SAMPLES, dtype=np.float32),
    np.zeros((1, FRAME_SAMPLES), dtype=np.int16),
    [0] * FRAME_SAMPLES,
])
def test_wrong_frame_is_rejected(bad: object) -> None:
    vad = VadSegmenter(VadConfig())
    with pytest.raises(ValueError):
        vad.push(bad)  # type: ignore[arg-type]
    assert vad.position_ms == 0


@pytest.mark.parametrize("bad", [
    {"aggressiveness": 4}, {"aggressiveness": -1}, {"onset_ms": 2_001}, {"silence_ms": -1},
    {"silence_ms": 10_001}, {"preroll_ms": 5_001}, {"max_utterance_ms": FRAME_MS - 1},
    {"max_utterance_ms": 120_001}, {"onset_ms": 2.5},
])
def test_config_out_of_bounds_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        VadConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=next(iter(bad))):
        dataclasses.replace(VadConfig(), **bad)  # a session update's path


def test_config_takes_the_bounds_and_settings_text() -> None:
    edges = VadConfig(aggressiveness=0, onset_ms=0, silence_ms=0, preroll_ms=0,
                      max_utterance_ms=FRAME_MS)
    assert (edges.onset_ms, edges.max_utterance_ms) == (0, FRAME_MS)
    assert VadConfig(max_utterance_ms="5000").max_utterance_ms == 5000  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        edges.silence_ms = 100  # type: ignore[misc]


def test_voiced_ms_measures_speech_in_progress(speech: Speech) -> None:
    vad = VadSegmenter(VadConfig())
    assert vad.voiced_ms == 0
    feed(vad, speech.pcm[: (speech.start_ms + 400) * SAMPLES_PER_MS])
    assert vad.in_speech
    assert 300 <= vad.voiced_ms <= 400 + TOLERANCE_MS
    # Trailing silence does not count as speech: the figure stays until the utterance closes.
    held = vad.voiced_ms
    feed(vad, silence(200))
    assert vad.voiced_ms == held
    feed(vad, silence(1000))
    assert vad.voiced_ms == 0


def test_the_energy_gate_measures_what_np_var_does() -> None:
    rng = np.random.default_rng(7)
    frames = [rng.normal(0, scale, FRAME_SAMPLES).clip(-32768, 32767).astype(np.int16)
              for scale in (3.0, 9.0, 11.0, 300.0, 30_000.0)]
    frames += [np.full(FRAME_SAMPLES, 32767, np.int16), np.full(FRAME_SAMPLES, -32768, np.int16),
               (np.arange(FRAME_SAMPLES) % 2 * 65535 - 32768).astype(np.int16),
               np.full(FRAME_SAMPLES, 20_000, np.int16) + rng.integers(-12, 12, FRAME_SAMPLES,
                                                                       dtype=np.int16)]
    for frame in frames:
        assert frame_variance(frame) == pytest.approx(float(np.var(frame.astype(np.float64))),
                                                 rel=1e-9, abs=1e-6)
