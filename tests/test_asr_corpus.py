"""The spoken-question corpus of `omnivox bench asr` and the local profile's recognition of it.

A slice of the corpus (the first texts, two voices, or all voices) is generated into a temporary
directory, as the bench does into its cache: its structure (voices, rates, conditions, the noisy
copy's SNR measured back, the unfinished utterances' pause) and its determinism are checked, and
the local profile's recognizer settings (RecognizerSettings' defaults) must hear its clean
questions within a word-error-rate floor they were measured to meet.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.bench.asr import Config, hear_all, summary
from agent.bench.asr_corpus import (
    PAUSE_MS,
    PREROLL_MS,
    SNR_DB,
    Corpus,
    build,
    load_or_build,
    snr_db,
)
from agent.bench.asr_texts import QUESTIONS
from agent.bench.asr_voices import RATES, VOICES
from agent.bench.speech import MIC_RATE
from pipeline.families.kit.speech_recognizer import RecognizerSettings

TEXTS = 3  # the first questions and unfinished sentences
# The two voices tiny.en hears worst ("What is the capital and friends?"): a slice that errs.
SLICE_VOICES = ("en-gb", "en-us+m3")
# Measured with the profile's settings (greedy) on these 6 utterances: 0.118, 4 of 34 words
# (a beam of 5: 0.088); one word's margin for another CPU's arithmetic.
WER_FLOOR = 0.15


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    directory = tmp_path_factory.mktemp("asr-corpus")
    build(directory, progress=False, limit=1)
    return load_or_build(directory)


@pytest.fixture(scope="module")
def slice_corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    directory = tmp_path_factory.mktemp("asr-slice")
    build(directory, progress=False, limit=TEXTS, voices=SLICE_VOICES)
    return load_or_build(directory)


def test_every_voice_says_each_question_at_two_rates_clean_and_noisy(corpus: Corpus) -> None:
    questions = [u for u in corpus.utterances if u.kind == "question"]
    assert {(u.voice, u.rate, u.condition) for u in questions} == {
        (v.name, rate, condition) for v in VOICES for rate in RATES
        for condition in ("clean", "noisy")}
    assert {u.text for u in questions} == {QUESTIONS[0]}
    for voice in VOICES:  # the fast copy is shorter by about its speed factor
        normal, fast = (next(u for u in questions if u.voice == voice.name and u.rate == rate
                             and u.condition == "clean") for rate in ("normal", "fast"))
        preroll_s = PREROLL_MS / 1000
        assert fast.duration_s - preroll_s < (normal.duration_s - preroll_s) * 0.9, voice.name


def test_the_noisy_copy_is_the_clean_one_at_15_db_snr(corpus: Corpus) -> None:
    by_id = {u.id: u for u in corpus.utterances}
    for noisy in (u for u in corpus.utterances if u.condition == "noisy"):
        clean = by_id[noisy.id.replace("-noisy", "-clean")]
        measured = snr_db(corpus.audio(clean), corpus.audio(noisy))
        assert abs(measured - SNR_DB) < 0.5, (noisy.id, measured)


def test_an_unfinished_utterance_is_preroll_speech_pause_speech(corpus: Corpus) -> None:
    unfinished = [u for u in corpus.utterances if u.kind == "unfinished"]
    assert {u.voice for u in unfinished} == {v.name for v in VOICES}
    for u in unfinished:
        assert u.pause_ms is not None
        start, end = u.pause_ms
        assert PAUSE_MS[0] <= end - start <= PAUSE_MS[1]
        pcm = corpus.audio(u)
        at = [ms * MIC_RATE // 1000 for ms in (start + 1, end)]  # whole ms inside the pause
        onset = PREROLL_MS * MIC_RATE // 1000
        assert not np.any(pcm[:onset]) and not np.any(pcm[at[0]:at[1]]), u.id  # silences
        assert np.abs(pcm[onset:at[0]]).max() > 1000 and np.abs(pcm[at[1]:]).max() > 1000, u.id


def test_the_corpus_is_the_same_on_every_run(corpus: Corpus, tmp_path: Path) -> None:
    build(tmp_path, progress=False, limit=1)
    again = load_or_build(tmp_path)
    assert again.utterances == corpus.utterances
    for u in corpus.utterances:
        assert (tmp_path / u.file).read_bytes() == (corpus.directory / u.file).read_bytes(), u.id


def test_the_local_profile_hears_clean_questions_within_its_floor(slice_corpus: Corpus) -> None:
    clean = [u for u in slice_corpus.utterances
             if u.kind == "question" and u.condition == "clean" and u.rate == "normal"]
    assert len(clean) == TEXTS * len(SLICE_VOICES)
    config = Config("tiny.en", RecognizerSettings())
    result = summary(config, hear_all(config, slice_corpus, clean, progress=False))
    assert result["wer"]["question/clean"] <= WER_FLOOR, result["errors"]
