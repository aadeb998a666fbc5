"""The corpus's speakers: espeak-ng voices and variants, and the Piper voice the project installs,
each at a speaking rate, as trimmed 16 kHz int16 PCM.

The Piper voice speaks with its sampling noise off (noise_scale = noise_w = 0): with it on, the
same text comes out different each time, and the corpus must be the same on every run.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from agent.bench.speech import MIC_RATE, espeak, resample, trim

if TYPE_CHECKING:
    from pipeline.families.local.phonemizer import PhonemeMap
    from pipeline.families.local.piper_voice import PiperVoice

ESPEAK_WPM = 175  # espeak-ng's default rate, words a minute
PEAK_DBFS = -6.0  # every utterance's peak: room for the noise added on top


@dataclass(frozen=True)
class Voice:
    """A speaker of the corpus: `engine` is "espeak" (with its voice name) or "piper"."""

    name: str
    engine: str
    espeak_voice: str = ""


VOICES: tuple[Voice, ...] = (
    Voice("en-us", "espeak", "en-us"),
    Voice("en-gb", "espeak", "en-gb"),
    Voice("en-us+m3", "espeak", "en-us+m3"),
    Voice("en-us+f2", "espeak", "en-us+f2"),
    Voice("piper-joe", "piper"),
)
RATES: dict[str, float] = {"normal": 1.0, "fast": 1.25}  # speed factors


def speak(voice: Voice, text: str, rate: float) -> np.ndarray:
    """`text` said by `voice` at `rate` times its normal speed: 16 kHz int16, trimmed to its
    audible part, peak at PEAK_DBFS."""
    if voice.engine == "piper":
        pcm, sample_rate = _piper_speak(text, rate)
    else:
        with tempfile.TemporaryDirectory(prefix="asr-corpus-") as scratch:
            pcm, sample_rate = espeak(text, Path(scratch) / "raw.wav", voice.espeak_voice,
                                      round(ESPEAK_WPM * rate))
    return _at_peak(resample(trim(pcm, sample_rate), sample_rate, MIC_RATE))


def _at_peak(pcm: np.ndarray) -> np.ndarray:
    peak = float(np.abs(pcm.astype(np.float64)).max())
    gain = 32767.0 * 10 ** (PEAK_DBFS / 20) / peak
    return np.round(pcm.astype(np.float64) * gain).astype(np.int16)


def _piper_speak(text: str, rate: float) -> tuple[np.ndarray, int]:
    """The Piper joe voice's int16 PCM and sample rate (its length scale is 1 / rate)."""
    from pipeline.families.local.phonemizer import EspeakPhonemizer
    from pipeline.families.local.speech_text import speakable, split_phrases

    phoneme_map, voice = _piper(rate)
    # A phonemizer per utterance: its process limit belongs to the event loop it first ran on.
    phonemizer = EspeakPhonemizer(phoneme_map.espeak_voice)
    ipa = asyncio.run(phonemizer.phonemize(split_phrases(speakable(text))))
    audio = voice.synthesize(phoneme_map.to_ids(" ".join(ipa)))
    return np.round(audio * 32767.0).astype(np.int16), voice.sample_rate


@cache
def _piper(rate: float) -> tuple[PhonemeMap, PiperVoice]:
    """The voice's phoneme map and model at a speed, loaded once."""
    from pipeline.families.kit import packaged
    from pipeline.families.local.phonemizer import PhonemeMap
    from pipeline.families.local.piper_voice import PiperVoice

    config = packaged.VOICE_CONFIG.locate()
    voice = PiperVoice(packaged.VOICE_MODEL.locate(), config, scales={
        "noise_scale": 0.0, "noise_w": 0.0, "length_scale": 1.0 / rate})
    return PhonemeMap.from_config(config), voice
