"""An omni release's audio tower: its thinker's audio encoder, fed the caller's audio as Whisper
log-mel features, the way the family's reference processor makes them.

What the omni families' towers share (qwen25_omni's and qwen3_omni's `audio_tower.py`):
transformers' own audio encoder module, built from the release's `thinker_config.audio_config`
and loaded from its `thinker.audio_tower.*` tensors where its `Placement` says (the CPU in
float32 by default), beside the release's WhisperFeatureExtractor; and the caller's int16 (or
float in [-1, 1]) 16 kHz audio made into the utterance's log-mel frames on the CPU, the frames
of real audio kept. What a family says: its configuration and encoder classes, the processor's
padding and truncation (`mel_options`), and how utterances go through the encoder (`encode`,
`encode_many`).
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
import torch
from transformers import PretrainedConfig, WhisperFeatureExtractor

from pipeline.families.kit.release_tensors import release_tensors
from pipeline.families.kit.torch_placement import Placement
from pipeline.families.kit.transformers_internals import model_from_config

SAMPLE_RATE = 16000
INT16_SCALE = 32768.0


def pcm_float(audio: np.ndarray) -> np.ndarray:
    """Mono audio as 1-D float samples in [-1, 1] (int16 scaled, float kept as it is)."""
    pcm = audio.reshape(-1)
    if pcm.dtype == np.int16:
        pcm = pcm.astype(np.float32) / INT16_SCALE
    return pcm


class WhisperAudioTower(abc.ABC):
    """16 kHz mono audio -> (rows, thinker hidden) audio features."""

    # The release's configuration class: its `thinker_config.audio_config` builds the encoder.
    config_class: ClassVar[type[PretrainedConfig]]
    # How the reference processor pads and cuts the utterance's Whisper features.
    mel_options: ClassVar[dict[str, Any]]

    def __init__(self, features: WhisperFeatureExtractor, encoder: torch.nn.Module,
                 placement: Placement):
        self.features = features
        self.encoder = encoder
        self.placement = placement

    @staticmethod
    @abc.abstractmethod
    def encoder_class() -> type[torch.nn.Module]:
        """transformers' audio encoder module of the family (reached through
        `transformers_internals.py`: transformers does not export it)."""

    @classmethod
    def load(cls, release: Path, placement: Placement | None = None) -> Self:
        """The release's feature extractor and audio encoder (eval), placed (default: CPU,
        float32)."""
        placement = placement or Placement(torch.device("cpu"), torch.float32)
        thinker: Any = cls.config_class.from_pretrained(release).thinker_config  # a sub-config
        encoder = model_from_config(cls.encoder_class(), thinker.audio_config,
                                    dtype=placement.dtype)
        encoder.load_state_dict(release_tensors(release, "thinker.audio_tower."))
        torch.nn.Module.to(encoder, placement.device)  # in place (typed apart from PreTrained)
        return cls(WhisperFeatureExtractor.from_pretrained(release), encoder.eval(), placement)

    @abc.abstractmethod
    def encode(self, audio: np.ndarray) -> torch.Tensor:
        """The rows of int16 (or float in [-1, 1]) 16 kHz mono audio."""

    @abc.abstractmethod
    def encode_many(self, audios: list[np.ndarray]) -> list[torch.Tensor]:
        """The rows of several utterances."""

    def _mel(self, audio: np.ndarray) -> torch.Tensor:
        """(mel bins, frames of real audio) log-mel features, as the reference processor makes
        them (`mel_options`)."""
        mel = self.features(pcm_float(audio), sampling_rate=SAMPLE_RATE,
                            return_attention_mask=True, return_tensors="pt", **self.mel_options)
        frames = int(mel["attention_mask"].sum())
        features: torch.Tensor = mel["input_features"][0, :, :frames]
        return features
