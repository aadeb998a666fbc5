"""The thinker's final-layer hidden states of a request, for the Talker, computed beside vLLM.

vLLM streams tokens, not hidden states, so the Thinker worker runs the same language model
(transformers' Qwen2 on the thinker_lm directory, float32 by default) with a KV cache of its
own per request: the prompt once, then each delta's reply tokens as they arrive. The rows
handed to the Talker are what the reference (`Qwen2_5OmniForConditionalGeneration.generate`)
adds up for it:

- prompt rows: final hidden state (after the final norm, transformers' `hidden_states[-1]`)
  plus the prompt's input embedding, zero in the audio rows (`embeds_to_talker`);
- reply rows, one per reply token fed: the final hidden state at that token's position plus
  that token's own embedding (`thinker_reply_part`).

Greedy decoding is a pure function of the prompt, so these states equal the ones the reference
thinker computes while generating the same tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import DynamicCache, Qwen2Model

from pipeline.families.qwen25_omni.thinker_prompt import ThinkerPrompt


class ThinkerStates:
    """The thinker LM in transformers, for hidden states; one `ReplyStates` per request."""

    def __init__(self, model: Qwen2Model) -> None:
        self.model = model

    @classmethod
    def load(cls, directory: Path, device: str = "cpu",
             dtype: torch.dtype = torch.float32) -> ThinkerStates:
        """The LM of a thinker_lm directory (its lm_head is not needed and not loaded)."""
        model = Qwen2Model.from_pretrained(directory, dtype=dtype).eval()
        torch.nn.Module.to(model, torch.device(device))  # in place (typed apart from PreTrained)
        return cls(model)

    @property
    def embed_table(self) -> torch.Tensor:
        """(vocab, hidden) input embeddings."""
        weight: torch.Tensor = self.model.embed_tokens.weight
        return weight.detach()

    @torch.inference_mode()
    def open(self, prompt: ThinkerPrompt) -> tuple[ReplyStates, torch.Tensor]:
        """The request's state after its prompt, and the prompt rows for the Talker."""
        cache = DynamicCache(config=self.model.config)
        embeds = prompt.embeds.to(self.embed_table)
        hidden = self._forward(embeds, cache, 0)
        text_embeds = embeds.masked_fill(prompt.audio_rows.to(embeds.device)[:, None], 0.0)
        return ReplyStates(self, cache, len(prompt)), (hidden + text_embeds).float().cpu()

    def _forward(self, embeds: torch.Tensor, cache: DynamicCache, start: int) -> torch.Tensor:
        """Final-layer (normed) hidden states of `embeds` at positions start.., the cache grown."""
        positions = torch.arange(start, start + len(embeds), device=embeds.device)[None]
        out = self.model(inputs_embeds=embeds[None], position_ids=positions,
                         past_key_values=cache, use_cache=True)
        hidden: torch.Tensor = out.last_hidden_state[0]
        return hidden


class ReplyStates:
    """One request's KV cache in the hidden-state model, fed reply tokens as they arrive."""

    def __init__(self, states: ThinkerStates, cache: DynamicCache, length: int) -> None:
        self.states = states
        self.cache = cache
        self.length = length  # positions fed so far

    @torch.inference_mode()
    def step(self, token_ids: list[int]) -> torch.Tensor:
        """(len(token_ids), hidden) float32 CPU rows: hidden state + embedding of each token."""
        table = self.states.embed_table
        embeds = table[torch.tensor(token_ids, dtype=torch.long, device=table.device)]
        hidden = self.states._forward(embeds, self.cache, self.length)
        self.length += len(token_ids)
        return (hidden + embeds).float().cpu()
