"""What an omni family's reference processor makes of a chat turn with the caller's audio, its
steps spelled out (the processors' image and video parts need torchvision): the release's
Whisper features of the audio, and its chat template over the messages and one audio part, the
audio placeholder once per audio-encoder row (test_qwen25_omni_thinker.py and
test_qwen3_omni_thinker_stage.py feed it to transformers' model as the reference).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoTokenizer, WhisperFeatureExtractor

Messages = list[dict[str, str]]


def whisper_features(release: Path, audio: np.ndarray,
                     **options: Any) -> Mapping[str, torch.Tensor]:
    """The release's Whisper features of int16 16 kHz `audio` (`input_features`,
    `attention_mask`), padded and cut as the processor's `options` say."""
    features: Mapping[str, torch.Tensor] = WhisperFeatureExtractor.from_pretrained(release)(
        audio.astype(np.float32) / 32768.0, sampling_rate=16_000, return_attention_mask=True,
        return_tensors="pt", **options)
    return features


def processor_inputs(release: Path, messages: Messages, features: Mapping[str, torch.Tensor],
                     audio_token: str, rows: int) -> dict[str, torch.Tensor]:
    """The model's inputs for `messages` and then one audio part: the chat template's text
    with `audio_token` once per audio-encoder row (`rows`), tokenized, and the `features`."""
    tokenizer: Any = AutoTokenizer.from_pretrained(release)
    template = json.loads((release / "chat_template.json").read_text())["chat_template"]
    turns = [*messages, {"role": "user", "content": [{"type": "audio"}]}]
    text: str = tokenizer.apply_chat_template(turns, chat_template=template,
                                              add_generation_prompt=True, tokenize=False)
    text = text.replace(audio_token, audio_token * rows)
    input_ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
            "input_features": features["input_features"],
            "feature_attention_mask": features["attention_mask"]}
