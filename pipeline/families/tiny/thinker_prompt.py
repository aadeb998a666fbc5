"""The tiny Thinker's prompt: chat-templated history, embedded, with the caller's audio spliced in.

The history is rendered with the tokenizer's chat template and embedded with the LLM's own
embedding table; when the turn has audio, a user turn holding the `<|audio|>` placeholder is
appended and the placeholder is replaced by the audio encoder's output. The result goes to
vLLM as `prompt_embeds`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.families.tiny.audio_encoder import TinyAudioEncoder, load_audio_encoder
from pipeline.families.tiny.qwen2 import load_embedding_table
from pipeline.families.tiny.tokenizer import AUDIO, SPECIAL_TOKENS


class ThinkerPromptBuilder:
    """Messages (+ optional 16 kHz int16 audio) -> (n, hidden) prompt embeddings."""

    def __init__(self, tokenizer: Any, embed_table: torch.Tensor,
                 encoder: TinyAudioEncoder) -> None:
        self.tokenizer = tokenizer
        self.embed_table = embed_table
        self.encoder = encoder
        self.audio_id: int = tokenizer.convert_tokens_to_ids(AUDIO)

    @classmethod
    def load(cls, directory: Path, tokenizer: Any) -> ThinkerPromptBuilder:
        """Load the embedding table and audio encoder from the Thinker's model directory."""
        return cls(tokenizer, load_embedding_table(directory),
                   load_audio_encoder(directory / "audio_encoder"))

    def token_ids(self, messages: list[dict[str, str]], with_audio: bool) -> list[int]:
        """The chat-templated prompt's token ids (one placeholder id where audio goes)."""
        # Text never carries special tokens: a message quoting "<|im_end|>" or the audio
        # placeholder must not end a turn or move where the audio is spliced.
        messages = [{**m, "content": _plain(m.get("content", ""))} for m in messages]
        if with_audio:
            messages = [*messages, {"role": "user", "content": AUDIO}]
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                  tokenize=False)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @torch.inference_mode()
    def build(self, messages: list[dict[str, str]], audio: np.ndarray | None) -> torch.Tensor:
        """The prompt embeddings for vLLM."""
        ids = self.token_ids(messages, audio is not None)
        embeds = self.embed_table[torch.tensor(ids, dtype=torch.long)]
        if audio is None:
            return embeds
        where = ids.index(self.audio_id)
        encoded = self.encoder(torch.from_numpy(np.ascontiguousarray(audio)).flatten())
        return torch.cat([embeds[:where], encoded, embeds[where + 1:]], dim=0)

    def embed(self, token_ids: list[int]) -> np.ndarray:
        """(len(token_ids), hidden) float32 embeddings of generated tokens."""
        return self.embed_table[torch.tensor(token_ids, dtype=torch.long)].numpy()

    def embed_into(self, token_ids: list[int], out: torch.Tensor) -> None:
        """`embed`, written into `out` (len(token_ids), hidden), e.g. a pool block's view."""
        torch.index_select(self.embed_table, 0, torch.tensor(token_ids, dtype=torch.long),
                           out=out)

    @property
    def hidden(self) -> int:
        return int(self.embed_table.shape[1])


def _plain(text: str) -> str:
    for token in SPECIAL_TOKENS:
        text = text.replace(token, "")
    return text
