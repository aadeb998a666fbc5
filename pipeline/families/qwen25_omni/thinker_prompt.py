"""The Qwen2.5-Omni thinker's prompt: chat-templated history, embedded, the audio spliced in.

The history is rendered with the release's chat template (the processor's chat_template.json
when the release has one, else the tokenizer's) in Qwen2.5-Omni's format: when the turn has
audio, a user message whose content is one audio part is appended, which the template writes
as <|audio_bos|><|AUDIO|><|audio_eos|>. As the reference processor does, the one <|AUDIO|>
becomes one token per audio-tower row; the prompt's embeddings are the thinker's embedding
table's rows with the audio tower's features in the <|AUDIO|> rows. The result goes to vLLM
as `prompt_embeds`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.families.kit.torch_placement import Placement
from pipeline.families.qwen25_omni.audio_tower import AudioTower

AUDIO = "<|AUDIO|>"
CHAT_TEMPLATE_FILE = "chat_template.json"


@dataclass(frozen=True)
class ThinkerPrompt:
    """One request's prompt: its token ids (audio rows as <|AUDIO|>) and its embeddings."""

    ids: list[int]
    embeds: torch.Tensor  # (len(ids), hidden) float32, audio features in the audio rows
    audio_rows: torch.Tensor  # (len(ids),) bool: the rows holding audio features

    def __len__(self) -> int:
        return len(self.ids)


class ThinkerPromptBuilder:
    """Messages (+ optional 16 kHz audio) -> a `ThinkerPrompt`."""

    def __init__(self, tokenizer: Any, chat_template: str | None, embed_table: torch.Tensor,
                 tower: AudioTower) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.embed_table = embed_table
        self.tower = tower
        self.audio_id: int = tokenizer.convert_tokens_to_ids(AUDIO)
        self.specials: list[str] = list(tokenizer.all_special_tokens)

    @classmethod
    def load(cls, release: Path, tokenizer: Any, embed_table: torch.Tensor,
             tower: Placement | None = None) -> ThinkerPromptBuilder:
        """The builder for a release, with the thinker's (vocab, hidden) embedding table and
        its audio tower placed at `tower` (default: CPU, float32)."""
        template_file = Path(release) / CHAT_TEMPLATE_FILE
        template = (json.loads(template_file.read_text())["chat_template"]
                    if template_file.is_file() else None)
        return cls(tokenizer, template, embed_table, AudioTower.load(release, tower))

    def token_ids(self, messages: list[dict[str, str]], audio_rows: int | None) -> list[int]:
        """The chat-templated prompt's ids, the audio placeholder widened to `audio_rows`."""
        # Text never carries special tokens: a message quoting "<|im_end|>" or "<|AUDIO|>"
        # must not end a turn or move where the audio is spliced.
        turns: list[dict[str, Any]] = [
            {**m, "content": self._plain(m.get("content", ""))} for m in messages]
        if audio_rows is not None:
            turns.append({"role": "user", "content": [{"type": "audio"}]})
        text = self.tokenizer.apply_chat_template(turns, chat_template=self.chat_template,
                                                  add_generation_prompt=True, tokenize=False)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if audio_rows is None:
            return ids
        where = ids.index(self.audio_id)
        return ids[:where] + [self.audio_id] * audio_rows + ids[where + 1:]

    @torch.inference_mode()
    def build(self, messages: list[dict[str, str]], audio: np.ndarray | None) -> ThinkerPrompt:
        """The prompt of the history and the caller's audio (int16 16 kHz), if any."""
        features = None if audio is None else self.tower.encode(audio)
        ids = self.token_ids(messages, None if features is None else len(features))
        return self.embed(ids, features)

    def embed(self, ids: list[int], features: torch.Tensor | None) -> ThinkerPrompt:
        """The prompt of these ids, `features` in its audio rows (None: no audio)."""
        index = torch.tensor(ids, dtype=torch.long)
        embeds = self.embed_table[index]
        audio_rows = index == self.audio_id
        if features is not None:
            # the table and the audio tower may live apart (states_device, audio_device)
            embeds[audio_rows] = features.to(embeds.device, embeds.dtype)
        return ThinkerPrompt(ids, embeds, audio_rows)

    def length(self, messages: list[dict[str, str]], audio_rows: int | None) -> int:
        """How long the prompt of these messages is (no embedding)."""
        return len(self.token_ids(messages, audio_rows))

    def _plain(self, text: str) -> str:
        for token in self.specials:
            text = text.replace(token, "")
        return text
