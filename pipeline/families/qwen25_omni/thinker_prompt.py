"""The Qwen2.5-Omni thinker's prompt: chat-templated history, embedded, the audio spliced in.

The kit's prompt builder (`kit/audio_prompt.py`) in Qwen2.5-Omni's format: a user message whose
content is one audio part is written as <|audio_bos|><|AUDIO|><|audio_eos|>, and the one
<|AUDIO|> becomes one token per audio-tower row (`audio_tower.py`), as the reference processor
does.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.families.kit.audio_prompt import AudioPromptBuilder, ThinkerPrompt
from pipeline.families.qwen25_omni.audio_tower import AudioTower

__all__ = ["AUDIO", "ThinkerPrompt", "ThinkerPromptBuilder"]

AUDIO = "<|AUDIO|>"


class ThinkerPromptBuilder(AudioPromptBuilder):
    """Messages (+ optional 16 kHz audio) -> a `ThinkerPrompt`, with the release's audio
    tower."""

    audio_token = AUDIO
    tower_class = AudioTower

    @torch.inference_mode()
    def build(self, messages: list[dict[str, str]], audio: np.ndarray | None) -> ThinkerPrompt:
        """The prompt of the history and the caller's audio (int16 16 kHz), if any."""
        features = None if audio is None else self.tower.encode(audio)
        ids = self.token_ids(messages, None if features is None else len(features))
        return self.embed(ids, features)
