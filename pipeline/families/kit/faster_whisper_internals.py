"""The one module that reaches into faster-whisper's undocumented internals (written for
faster-whisper 1.2); each reach is checked and raises `FasterWhisperInternalsError`, naming
what is gone and the installed version, when an upgrade moved it. On another release than the
one it was written for, the first reach logs a warning once; the reaches are checked one by one
either way. tests/test_faster_whisper_internals.py checks every one of them against the
installed faster-whisper, on the packaged Whisper tiny.en.

faster-whisper documents `WhisperModel.transcribe` alone; the recogniser (`speech_recognizer.py`)
hears a short utterance in a window cut to its length, which `transcribe` cannot do (it pads
every utterance to 30 s: docs/measurements/2026-12-01-asr.md), so it runs the model's parts
itself. What is reached, and what upstream could offer instead:

- `WhisperModel.model` (CTranslate2's `ctranslate2.models.Whisper`; its `encode`, `generate`
  and `is_multilingual` are CTranslate2's public API): the encoder run on a window of our
  length (`encode`) and the decoder from our prompt (`generate`). A window length option to
  `transcribe` (and its per-segment scores, which it has) would retire both.
- `WhisperModel.feature_extractor` (its `FeatureExtractor`: called on samples, with
  `sampling_rate`, `hop_length`, `nb_max_frames`): the log-mel features the window is cut from.
- `WhisperModel.hf_tokenizer` and `faster_whisper.tokenizer.Tokenizer` (not exported by the
  package; its `encode`, `decode`, `sot_prev`, `sot_sequence`, `no_timestamps`): the decoder
  prompt's ids and the text of the ids decoded.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.families.kit.library_reach import LibraryReach

WRITTEN_FOR = "1.2"  # the faster-whisper release (major.minor) this module was written for
EXTRACTOR_FIELDS = ("sampling_rate", "hop_length", "nb_max_frames")
TOKENIZER_FIELDS = ("encode", "decode", "sot_prev", "sot_sequence", "no_timestamps")

logger = logging.getLogger(__name__)


class FasterWhisperInternalsError(RuntimeError):
    """faster-whisper lacks (or changed) something omnivox relies on: an upgrade moved it, and
    pipeline/families/kit/faster_whisper_internals.py needs to follow."""


REACH = LibraryReach("faster-whisper", WRITTEN_FOR,
                     "pipeline/families/kit/faster_whisper_internals.py",
                     FasterWhisperInternalsError, logger)
_attribute = REACH.attribute
_missing = REACH.missing


def ctranslate2_whisper(model: Any) -> Any:
    """The `WhisperModel`'s CTranslate2 model (`ctranslate2.models.Whisper`)."""
    whisper = _attribute(model, "WhisperModel", "model",
                         "its CTranslate2 model, run on windows of our own length")
    for name in ("encode", "generate", "is_multilingual"):
        _attribute(whisper, "WhisperModel.model", name, "CTranslate2's Whisper API")
    return whisper


def feature_extractor(model: Any) -> Any:
    """The `WhisperModel`'s log-mel feature extractor: `extractor(samples)` (mel bins,
    frames), with `sampling_rate`, `hop_length` and `nb_max_frames`."""
    extractor = _attribute(model, "WhisperModel", "feature_extractor",
                           "the log-mel features a short window is cut from")
    for name in EXTRACTOR_FIELDS:
        _attribute(extractor, "WhisperModel.feature_extractor", name,
                   "the log-mel features' rate and the longest window")
    return extractor


def text_tokenizer(model: Any, language: str = "en") -> Any:
    """Whisper's tokenizer for transcribing `language`, as `WhisperModel.transcribe` makes
    it: `encode`, `decode`, `sot_prev`, `sot_sequence`, `no_timestamps`."""
    try:
        module = importlib.import_module("faster_whisper.tokenizer")
    except ImportError as exc:
        raise _missing("module faster_whisper.tokenizer", "Whisper's tokenizer") from exc
    tokenizer_class = _attribute(module, "faster_whisper.tokenizer", "Tokenizer",
                                 "Whisper's tokenizer")
    hf_tokenizer = _attribute(model, "WhisperModel", "hf_tokenizer",
                              "the tokenizers.Tokenizer Whisper's tokenizer wraps")
    tokenizer = tokenizer_class(hf_tokenizer, ctranslate2_whisper(model).is_multilingual,
                                task="transcribe", language=language)
    for name in TOKENIZER_FIELDS:
        _attribute(tokenizer, "faster_whisper.tokenizer.Tokenizer", name,
                   "the decoder prompt's ids and the decoded text")
    return tokenizer


def encode(model: Any, window: np.ndarray) -> Any:
    """The encoder's output for `window`, (1, mel bins, frames) float32 log-mel features of
    any length up to 30 s (a CTranslate2 StorageView, for `generate`)."""
    import ctranslate2

    return ctranslate2_whisper(model).encode(ctranslate2.StorageView.from_array(window))


def generate(model: Any, encoded: Any, prompts: Sequence[Sequence[int]], **options: Any
             ) -> list[Any]:
    """CTranslate2's `Whisper.generate` on the encoded window from each prompt's ids
    (`WhisperGenerationResult`s: `sequences_ids`, `scores`, `no_speech_prob`)."""
    results: list[Any] = ctranslate2_whisper(model).generate(
        encoded, [list(prompt) for prompt in prompts], **options)
    return results
