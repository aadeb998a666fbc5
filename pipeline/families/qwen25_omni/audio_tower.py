"""Qwen2.5-Omni's audio tower: the caller's 16 kHz audio to rows for the thinker's prompt.

The kit's tower (`kit/audio_tower.py`) with transformers' own `Qwen2_5OmniAudioEncoder` module
(which transformers does not export: reached through `kit/transformers_internals.py`), its
weights loaded from the release (`thinker.audio_tower.*`), fed the release's Whisper log-mel
features exactly as the reference processor makes them: padded to 30 s ("max_length"; the
log-mel floor depends on the whole padded array), then only the frames of real audio kept.
Longer audio is cut at 30 s, as the processor cuts it. One output row per 40 ms of audio. The
encoder runs where its `Placement` says (the CPU in float32 by default; the GPU in bfloat16 in
the `omni` profile); the features are computed on the CPU and its rows stay on its device.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from transformers import Qwen2_5OmniConfig

from pipeline.families.kit.audio_tower import WhisperAudioTower
from pipeline.families.kit.transformers_internals import audio_encoder_class, feature_lengths


class AudioTower(WhisperAudioTower):
    """16 kHz mono audio -> (rows, thinker hidden) float32 audio features."""

    config_class = Qwen2_5OmniConfig
    # padded to 30 s (cut there), as the processor pads
    mel_options: ClassVar[dict[str, Any]] = {"padding": "max_length"}

    @staticmethod
    def encoder_class() -> type[torch.nn.Module]:
        return audio_encoder_class()

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
