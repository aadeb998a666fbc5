"""Qwen3-Omni's audio tower: the caller's 16 kHz audio to rows for the thinker's prompt.

The kit's tower (`kit/audio_tower.py`) with transformers' own `Qwen3OmniMoeAudioEncoder` module
(which transformers does not export: reached through `kit/transformers_internals.py`), its
weights loaded from the release (`thinker.audio_tower.*`), fed the release's Whisper log-mel
features exactly as the reference processor (`Qwen3OmniMoeProcessor`) makes them: the
utterance alone, neither padded nor cut (`padding=True`, the longest of one, and
`truncation=False`: the log-mel floor is the utterance's own). Every 100 mel frames (1 s) give
13 rows, the rest its frames halved three times: the processor's count of <|audio_pad|> tokens,
which is the encoder's own.

Each utterance is encoded alone: the encoder pads every 1-s window of a batch to the longest
one, so an utterance under a second encoded beside a longer one would get other rows than the
reference gives it alone. The encoder runs where its `Placement` says (the CPU in float32 by
default; the GPU in bfloat16 in the `omni` profile); the features are computed on the CPU and
its rows stay on its device.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from transformers import Qwen3OmniMoeConfig

from pipeline.families.kit.audio_tower import WhisperAudioTower
from pipeline.families.kit.transformers_internals import qwen3_audio_encoder_class


class AudioTower(WhisperAudioTower):
    """16 kHz mono audio -> (rows, thinker hidden) audio features."""

    config_class = Qwen3OmniMoeConfig
    # the utterance alone, neither padded nor cut
    mel_options: ClassVar[dict[str, Any]] = {"padding": "longest", "truncation": False}

    @staticmethod
    def encoder_class() -> type[torch.nn.Module]:
        return qwen3_audio_encoder_class()

    @torch.inference_mode()
    def encode(self, audio: np.ndarray) -> torch.Tensor:
        """The rows of int16 (or float in [-1, 1]) 16 kHz mono audio."""
        mel = self._mel(audio).to(self.placement.device, self.placement.dtype)
        frames: Any = torch.tensor([mel.shape[-1]], device=self.placement.device)
        hidden: torch.Tensor = self.encoder(mel, feature_lens=frames).last_hidden_state
        return hidden

    def encode_many(self, audios: list[np.ndarray]) -> list[torch.Tensor]:
        """The rows of several utterances, each encoded alone (see the module's docstring)."""
        return [self.encode(audio) for audio in audios]
