"""`omnivox bench turn-ends`' replay, without engines: the pauses a call's VAD marks in spoken
audio, and where each mode ends a turn from the scores and timings of its pauses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.bench.asr_corpus import Utterance
from agent.bench.turn_ends import (
    SERVER_VAD,
    TAIL_MS,
    Judged,
    Pause,
    ending,
    pauses_of,
    summary,
)
from agent.realtime.turn_taking.semantic_turns import EAGERNESS, PAUSE_MS
from media.audio_format import SAMPLES_PER_MS
from tests.audio_fixtures import read_wav, speech_bounds, speech_wav


def utterance(kind: str) -> Utterance:
    return Utterance("x", kind, "words", "en-us", "normal", "clean", "x.wav", 1.0)


def test_the_gap_and_the_tail_are_the_pauses_with_their_silences(tmp_path: Path) -> None:
    said = read_wav(speech_wav("Can you tell me how to get to", tmp_path / "a.wav",
                               rate=16_000, pad_before_s=0.3, pad_after_s=0.0))[0]
    start_ms, end_ms = speech_bounds(said, 16_000)
    words = said[start_ms * SAMPLES_PER_MS:end_ms * SAMPLES_PER_MS]
    gap_ms = 700
    lead = np.zeros(300 * SAMPLES_PER_MS, np.int16)
    pcm = np.concatenate([lead, words, np.zeros(gap_ms * SAMPLES_PER_MS, np.int16), words])
    pauses = pauses_of(pcm)
    assert len(pauses) >= 2
    (gap, gap_silence), (tail, tail_silence) = pauses[-2], pauses[-1]
    assert gap_ms - 100 <= gap_silence <= gap_ms + 200, gap_silence
    assert tail_silence >= TAIL_MS
    assert tail.audio_end_ms > gap.audio_end_ms + gap_ms
    assert len(tail.pcm) > len(gap.pcm)


def judged(kind: str, *pauses: tuple[int, float, float]) -> Judged:
    """Pauses as (silence ms, score, judgement ms), the last one the utterance's end."""
    return Judged(utterance(kind), tuple(Pause(1000 * i, silence, "", score, took)
                                         for i, (silence, score, took) in enumerate(pauses)))


def test_a_mode_ends_at_a_whole_pause_in_time_else_at_its_silence() -> None:
    medium = EAGERNESS["medium"]
    finished = judged("question", (3000, 0.9, 300.0))
    assert ending(finished, medium).delay_ms == pytest.approx(PAUSE_MS + 300.0)
    assert ending(finished, SERVER_VAD).delay_ms == SERVER_VAD.silence_ms
    unsure = judged("question", (3000, 0.01, 300.0))
    assert ending(unsure, medium).delay_ms == medium.silence_ms
    # A broken-off sentence: judged unfinished at its gap, finished at its end.
    broken = judged("unfinished", (700, 0.0, 300.0), (3000, 0.9, 300.0))
    assert not ending(broken, medium).cut
    assert ending(broken, SERVER_VAD).cut  # 700 ms of silence outlasts server_vad's 500
    # Scored whole, but the caller went on before the judgement was back: not cut.
    late = judged("unfinished", (400, 0.9, 300.0), (3000, 0.9, 300.0))
    assert not ending(late, EAGERNESS["high"]).cut
    in_time = judged("unfinished", (700, 0.9, 300.0), (3000, 0.9, 300.0))
    assert ending(in_time, EAGERNESS["high"]).cut

    row = summary([finished, unsure, broken, in_time], "medium", medium)
    assert (row["questions"], row["questions_cut"]) == (2, 0)
    assert (row["unfinished"], row["unfinished_cut"]) == (2, 1)
    assert row["end_ms_p50"] == pytest.approx((PAUSE_MS + 300.0 + medium.silence_ms) / 2)
