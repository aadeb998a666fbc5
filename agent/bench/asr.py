"""`omnivox bench asr`: word error rate and recognition latency of the local family's Whisper,
per voice and condition of the spoken-question corpus, for each recognizer configuration asked.

Each configuration (model x beam x temperature fallback x prompt x window x leading silence)
hears every utterance of the corpus (asr_corpus.py) through the local family's own
SpeechRecognizer, one utterance at a time, as the Thinker does after the end of a turn: its
recognition latency is the whole transcribe() call, wall clock and CPU time of this process
(the machine may be shared). For utterances of about 3 s it is split into features, encoder and
decoder.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from agent.bench.asr_confidence import asking_again
from agent.bench.asr_corpus import Corpus, Utterance
from agent.bench.asr_score import Heard, word_error_rate
from pipeline.families.kit.faster_whisper_internals import encode
from pipeline.families.kit.speech_recognizer import (
    RecognizerSettings,
    SpeechRecognizer,
    as_float,
)

FALLBACK = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # faster-whisper's temperatures
# The line Whisper is prompted with: what the agent said last. The corpus's questions open a
# conversation, so it is the greeting a caller hears first.
PROMPT_CONTEXT = ("Hello! How can I help you today?",)
THREE_S = (2.5, 3.5)  # "about 3 s": the utterances whose latency the target is about


@dataclass(frozen=True)
class Config:
    """One recognizer configuration of the sweep."""

    model: str  # "tiny.en" (the local family's), or a CTranslate2 Whisper directory
    settings: RecognizerSettings

    @property
    def label(self) -> str:
        s = self.settings
        fallback = "fallback" if len(s.temperatures) > 1 else "greedy" if s.beam_size == 1 \
            else "beam"
        return (f"{Path(self.model).name} beam={s.beam_size} {fallback} prompt={s.prompt_lines} "
                f"window={s.silence_before_s:g}+{s.window_min_s:g}+{s.silence_after_s:g}")


def model_dir(model: str) -> Path:
    """The CTranslate2 directory of `model`: the local family's tiny.en straight from its
    installed package (no build), or a directory given as such (another Whisper, e.g. base)."""
    from pipeline.families.kit import packaged

    if model == "tiny.en":
        return packaged.WHISPER["model.bin"].locate().parent
    if not (Path(model) / "model.bin").is_file():
        raise FileNotFoundError(f"{model}: not tiny.en, nor a directory with a model.bin")
    return Path(model)


def configs(model_names: Sequence[str], beams: Sequence[int], fallbacks: Sequence[bool],
            prompts: Sequence[int], windows: Sequence[tuple[float, float]],
            leads: Sequence[float], threads: int) -> list[Config]:
    """Every combination of the options asked, in order."""
    return [Config(model, RecognizerSettings(
        threads=threads, beam_size=beam, temperatures=FALLBACK if fallback else (0.0,),
        prompt_lines=prompt, window_min_s=window[0], silence_after_s=window[1],
        silence_before_s=lead))
        for model, beam, fallback, prompt, window, lead
        in itertools.product(model_names, beams, fallbacks, prompts, windows, leads)]


def hear_all(config: Config, corpus: Corpus, utterances: Sequence[Utterance],
             progress: bool = True) -> list[Heard]:
    """Every utterance transcribed by `config`, timed one by one."""
    recognizer = SpeechRecognizer(model_dir(config.model), config.settings)
    heard = []
    for utterance in tqdm(utterances, desc=config.label, unit="utt", disable=not progress):
        samples = corpus.audio(utterance)
        wall, cpu = time.perf_counter(), time.process_time()
        result = recognizer.hear(samples, PROMPT_CONTEXT)
        heard.append(Heard(utterance, result.text, (time.perf_counter() - wall) * 1000,
                           (time.process_time() - cpu) * 1000, result.mean_log_prob))
    return heard


def summary(config: Config, heard: Sequence[Heard]) -> dict[str, Any]:
    """WER per group (kind/voice/condition), overall figures and latency, as JSON-ready data."""
    groups: dict[str, list[Heard]] = {}
    for h in heard:
        u = h.utterance
        for key in (f"{u.kind}/{u.condition}", f"{u.kind}/{u.condition}/{u.voice}",
                    f"{u.kind}/{u.condition}/{u.rate}"):
            groups.setdefault(key, []).append(h)
    near_3s = set(three_second([h.utterance for h in heard]))
    three_s = [h for h in heard if h.utterance in near_3s]
    return {
        "config": config.label, "model": config.model,
        "settings": {**asdict(config.settings),
                     "temperatures": list(config.settings.temperatures)},
        "wer": {key: _wer(group) for key, group in sorted(groups.items())},
        "utterances": {key: len(group) for key, group in sorted(groups.items())},
        "latency_3s_ms": _percentiles([h.wall_ms for h in three_s]),
        "cpu_3s_ms": _percentiles([h.cpu_ms for h in three_s]),
        "latency_all_ms": _percentiles([h.wall_ms for h in heard]),
        "count_3s": len(three_s),
        "asking_again": asking_again(heard),
        "errors": [{"id": h.utterance.id, "said": h.utterance.text, "heard": h.text,
                    "mean_log_prob": round(h.mean_log_prob, 3)}
                   for h in heard if not h.right],
    }


def time_split(config: Config, corpus: Corpus,
               utterances: Sequence[Utterance]) -> dict[str, float]:
    """Median ms of a ~3 s clean utterance's recognition: features, encoder, whole call (the
    decoder being the rest)."""
    recognizer = SpeechRecognizer(model_dir(config.model), config.settings)
    parts: dict[str, list[float]] = {"features": [], "encoder": [], "total": []}
    for utterance in utterances:
        samples = as_float(corpus.audio(utterance))
        began = time.perf_counter()
        window = recognizer.short_window(samples)
        parts["features"].append((time.perf_counter() - began) * 1000)
        if window is None:
            continue
        began = time.perf_counter()
        encode(recognizer.model, window)
        parts["encoder"].append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        recognizer.transcribe(samples, PROMPT_CONTEXT)
        parts["total"].append((time.perf_counter() - began) * 1000)
    medians = {key: statistics.median(values) for key, values in parts.items() if values}
    if {"features", "encoder", "total"} <= medians.keys():
        medians["decoder"] = medians["total"] - medians["features"] - medians["encoder"]
    return medians


def three_second(utterances: Sequence[Utterance]) -> list[Utterance]:
    """The clean utterances of about 3 s."""
    return [u for u in utterances if u.condition == "clean"
            and THREE_S[0] <= u.duration_s <= THREE_S[1]]


def _wer(group: Sequence[Heard]) -> float:
    return round(word_error_rate([h.utterance.text for h in group], [h.text for h in group]), 4)


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = np.asarray(sorted(values))
    return {"p50": round(float(np.percentile(ordered, 50)), 1),
            "p90": round(float(np.percentile(ordered, 90)), 1), "n": len(values)}

