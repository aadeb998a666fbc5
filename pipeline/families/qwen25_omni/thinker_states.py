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

import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import DynamicCache, Qwen2Model

if TYPE_CHECKING:  # (a type only: `omnivox bench gpu-torch` loads this without the server)
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
    """One request's KV cache in the hidden-state model, fed reply tokens as they arrive
    (`step_many`)."""

    def __init__(self, states: ThinkerStates, cache: DynamicCache, length: int) -> None:
        self.states = states
        self.cache = cache
        self.length = length  # positions fed so far


@torch.inference_mode()
def step_many(steps: list[tuple[ReplyStates, list[int]]]) -> list[torch.Tensor]:
    """Several requests' reply steps in one forward: each request's (len(tokens), hidden)
    float32 CPU rows, the hidden state + embedding of each token fed.

    The norms and the MLP (about 87% of a layer's weights at the real width) run once over
    every request's new tokens together, so concurrent calls read the weights once a step; each
    request's attention runs over its own cache through the layer's own attention module. The
    layers are driven by their module names (`input_layernorm`, `self_attn`, `mlp`, ...), the
    checkpoint's own layout; the parity test against `model(...)` fails if transformers moves
    them. Each request appears at most once."""
    if len({id(reply) for reply, _ in steps}) != len(steps):
        raise ValueError("a request may take one step of a batch")
    states = steps[0][0].states
    model = states.model
    table = states.embed_table
    ids = torch.tensor([t for _, tokens in steps for t in tokens], device=table.device)
    embeds = table[ids]
    positions = torch.cat([torch.arange(reply.length, reply.length + len(tokens))
                           for reply, tokens in steps]).to(table.device)
    cos, sin = model.rotary_emb(embeds[None], positions[None])
    spans = _spans([len(tokens) for _, tokens in steps])
    hidden = embeds
    layers: list[Any] = list(model.layers)  # Qwen2DecoderLayer: typed as Module by torch
    for layer in layers:
        normed = layer.input_layernorm(hidden)
        attended = [layer.self_attn(hidden_states=normed[None, span],
                                    position_embeddings=(cos[:, span], sin[:, span]),
                                    attention_mask=_causal(reply, len(tokens), normed.device),
                                    past_key_values=reply.cache)[0][0]
                    for (reply, tokens), span in zip(steps, spans, strict=True)]
        hidden = hidden + torch.cat(attended)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    rows = (model.norm(hidden) + embeds).float().cpu()
    for reply, tokens in steps:
        reply.length += len(tokens)
    return [rows[span] for span in spans]


def _spans(lengths: list[int]) -> list[slice]:
    """Consecutive slices of these lengths."""
    ends = list(itertools.accumulate(lengths))
    return [slice(end - length, end) for end, length in zip(ends, lengths, strict=True)]


def _causal(reply: ReplyStates, new: int, device: torch.device) -> torch.Tensor | None:
    """The attention mask of `new` tokens after the request's cached ones (None for one token,
    which sees everything): token j sees positions up to length + j."""
    if new == 1:
        return None
    total = reply.length + new
    return torch.ones(new, total, dtype=torch.bool, device=device).tril(reply.length)[None, None]
