"""The prompt of a Thinker that hears the caller itself (the omni families): the chat-templated
history, embedded, the caller's audio spliced in.

The history is rendered with the release's chat template (the processor's chat_template.json
when the release has one, else the tokenizer's): when the turn has audio, a user message whose
content is one audio part is appended, which the family's template writes as its audio
placeholder between its delimiters. As the reference processors do, the one placeholder token
becomes one token per audio-encoder row; the prompt's embeddings are the thinker's embedding
table's rows with the audio encoder's rows in the placeholder rows. The result goes to vLLM as
`prompt_embeds`. A history too long for the window loses its oldest turns
(`context_window.fit_history`); the caller's audio always stays. A family's builder names its
audio placeholder (`audio_token`) and its audio tower (`tower_class`, `kit/audio_tower.py`),
which the builder holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import torch

from pipeline.families.kit.audio_tower import WhisperAudioTower
from pipeline.families.kit.context_window import fit_history
from pipeline.families.kit.torch_placement import Placement
from pipeline.stage import ThinkerJob

CHAT_TEMPLATE_FILE = "chat_template.json"


@dataclass(frozen=True)
class ThinkerPrompt:
    """One request's prompt: its token ids (audio rows as the placeholder) and embeddings."""

    ids: list[int]
    embeds: torch.Tensor  # (len(ids), hidden), audio features in the audio rows
    audio_rows: torch.Tensor  # (len(ids),) bool: the rows holding audio features

    def __len__(self) -> int:
        return len(self.ids)


def release_chat_template(release: Path) -> str | None:
    """The processor's chat template (chat_template.json) where the release has one."""
    template_file = Path(release) / CHAT_TEMPLATE_FILE
    if not template_file.is_file():
        return None
    template: str = json.loads(template_file.read_text())["chat_template"]
    return template


class AudioPromptBuilder:
    """Messages (+ the caller's audio rows) -> a `ThinkerPrompt`, with the release's audio
    tower."""

    audio_token: ClassVar[str]  # the placeholder the chat template writes for an audio part
    tower_class: ClassVar[type[WhisperAudioTower]]

    def __init__(self, tokenizer: Any, chat_template: str | None, embed_table: torch.Tensor,
                 tower: WhisperAudioTower) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.embed_table = embed_table
        self.tower = tower
        self.audio_id: int = tokenizer.convert_tokens_to_ids(self.audio_token)
        self.specials: list[str] = list(tokenizer.all_special_tokens)

    @classmethod
    def load(cls, release: Path, tokenizer: Any, embed_table: torch.Tensor,
             tower: Placement | None = None) -> Self:
        """The builder for a release, with the thinker's (vocab, hidden) embedding table and
        its audio tower placed at `tower` (default: CPU, float32)."""
        return cls(tokenizer, release_chat_template(release), embed_table,
                   cls.tower_class.load(release, tower))

    def token_ids(self, messages: list[dict[str, str]], audio_rows: int | None) -> list[int]:
        """The chat-templated prompt's ids, the audio placeholder widened to `audio_rows`."""
        # Text never carries special tokens: a message quoting "<|im_end|>" or the audio
        # placeholder must not end a turn or move where the audio is spliced.
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

    def embed(self, ids: list[int], features: torch.Tensor | None) -> ThinkerPrompt:
        """The prompt of these ids, `features` in its audio rows (None: no audio)."""
        index = torch.tensor(ids, dtype=torch.long)
        embeds = self.embed_table[index]
        audio_rows = index == self.audio_id
        if features is not None:
            # the table and the audio encoder may live apart (states_device, audio_device)
            embeds[audio_rows] = features.to(embeds.device, embeds.dtype)
        return ThinkerPrompt(ids, embeds, audio_rows)

    def length(self, messages: list[dict[str, str]], audio_rows: int | None) -> int:
        """How long the prompt of these messages is (no embedding)."""
        return len(self.token_ids(messages, audio_rows))

    def job_prompt(self, job: ThinkerJob, features: torch.Tensor | None,
                   max_model_len: int) -> ThinkerPrompt:
        """The job's prompt, the caller's audio `features` in its audio rows, its history
        fitted to the window: the oldest turns go when it is too long; the caller's audio
        always stays."""
        rows = None if features is None else len(features)
        fitted = fit_history(list(job.messages), lambda m: self.length(m, rows),
                             job.max_tokens, max_model_len,
                             keep=0 if rows is not None else 1, truncation=job.truncation)
        return self.embed(self.token_ids(fitted, rows), features)

    def _plain(self, text: str) -> str:
        for token in self.specials:
            text = text.replace(token, "")
        return text
