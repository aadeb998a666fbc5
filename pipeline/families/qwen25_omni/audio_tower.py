"""Qwen2.5-Omni's audio tower: the caller's 16 kHz audio to rows for the thinker's prompt.

transformers' own `Qwen2_5OmniAudioEncoder` module (which transformers does not export: reached
through `kit/transformers_internals.py`), its weights loaded from the release
(`thinker.audio_tower.*`), fed the release's Whisper log-mel features exactly as the
reference processor makes them: padded to 30 s ("max_length"; the log-mel floor depends on
the whole padded array), then only the frames of real audio kept. Longer audio is cut at 30 s,
as the processor cuts it. One output row per 40 ms of audio. The encoder runs where its
`Placement` says (the CPU in float32 by default; the GPU in bfloat16 in the `omni` profile);
the features are computed on the CPU and its rows stay on its device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import Qwen2_5OmniConfig, WhisperFeatureExtractor

from pipeline.families.kit.release_tensors import release_tensors
from pipeline.families.kit.torch_placement import Placement
from pipeline.families.kit.transformers_internals import (
    audio_encoder_class,
    feature_lengths,
    model_from_config,
)

SAMPLE_RATE = 16000
INT16_SCALE = 32768.0


class AudioTower:
    """16 kHz mono audio -> (rows, thinker hidden) float32 audio features."""

    def __init__(self, features: WhisperFeatureExtractor, encoder: torch.nn.Module,
                 placement: Placement):
        self.features = features
        self.encoder = encoder
        self.placement = placement

    @classmethod
    def load(cls, release: Path, placement: Placement | None = None) -> AudioTower:
        """The release's feature extractor and audio encoder (eval), placed (default: CPU,
        float32)."""
        placement = placement or Placement(torch.device("cpu"), torch.float32)
        thinker: Any = Qwen2_5OmniConfig.from_pretrained(release).thinker_config  # a sub-config
        encoder = model_from_config(audio_encoder_class(), thinker.audio_config,
                                    dtype=placement.dtype)
        encoder.load_state_dict(release_tensors(release, "thinker.audio_tower."))
        torch.nn.Module.to(encoder, placement.device)  # in place (typed apart from PreTrained)
        return cls(WhisperFeatureExtractor.from_pretrained(release), encoder.eval(), placement)

    def encode(self, audio: np.ndarray) -> torch.Tensor:
        """The features of int16 (or float in [-1, 1]) 16 kHz mono audio."""
        return self.encode_many([audio])[0]

    @torch.inference_mode()
    def encode_many(self, audios: list[np.ndarray]) -> list[torch.Tensor]:
        """The features of several utterances in one pass of the encoder, as the reference
        thinker encodes a batch: their frames joined, each attended within its own windows."""
        device, dtype = self.placement.device, self.placement.dtype
        mels = [self._mel(audio) for audio in audios]
        frames: Any = torch.tensor([mel.shape[-1] for mel in mels], device=device)  # a LongTensor
        features = torch.cat(mels, dim=-1).to(device, dtype)
        after_cnn, rows = feature_lengths(self.encoder, frames)
        encoded = self.encoder(features, feature_lens=frames, aftercnn_lens=after_cnn)
        hidden: torch.Tensor = encoded.last_hidden_state
        return list(hidden.split(rows.tolist()))

    def _mel(self, audio: np.ndarray) -> torch.Tensor:
        """(mel bins, frames of real audio) log-mel features, padded to 30 s first as the
        reference processor pads them (the log-mel floor depends on the whole array)."""
        pcm = audio.reshape(-1)
        if pcm.dtype == np.int16:
            pcm = pcm.astype(np.float32) / INT16_SCALE
        mel = self.features(pcm, sampling_rate=SAMPLE_RATE, padding="max_length",
                            return_attention_mask=True, return_tensors="pt")
        frames = int(mel["attention_mask"].sum())
        features: torch.Tensor = mel["input_features"][0, :, :frames]
        return features
