"""Greedy decoding in transformers, one forward() a step: the reference a vLLM stage's ids and
log-probabilities are held against (parity tests).

Each step applies what a vLLM request of the same Sampling applies, in vLLM's order: the
allowed ids (every other id masked), then the repetition penalty (transformers' own logits
processor, over prompt and output ids, as vLLM's), then argmax; a stop id ends the run. The
log-probability recorded is the chosen id's under the raw distribution (log-softmax of the
logits, before mask and penalty), which is what vLLM returns by default (`raw_logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, RepetitionPenaltyLogitsProcessor


@dataclass(frozen=True)
class Decoded:
    """A greedy run: the ids, their raw log-probabilities, and each step's winning margin."""

    ids: list[int]
    logprobs: list[float]
    margins: list[float]  # best minus second-best processed score: how far from a tie


@dataclass(frozen=True)
class Restrictions:
    """What a request does to the logits besides the model: a Sampling's constraints."""

    allowed_ids: list[int] | None
    repetition_penalty: float
    stop_ids: list[int]


def load_llama(directory: Path) -> LlamaForCausalLM:
    """The checkpoint in float32 (the engine's dtype), in eval mode."""
    model: LlamaForCausalLM = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.eval()
    return model


@torch.no_grad()
def greedy_decode(model: LlamaForCausalLM, prompt: list[int], steps: int,
                  restrictions: Restrictions) -> Decoded:
    """Up to `steps` greedy ids after `prompt`, one cached forward() a step."""
    ids = torch.tensor([prompt])
    mask = _mask(model.config.vocab_size, restrictions.allowed_ids)
    penalize = RepetitionPenaltyLogitsProcessor(restrictions.repetition_penalty)
    out = model(input_ids=ids, use_cache=True)
    decoded = Decoded([], [], [])
    for _ in range(steps):
        logits = out.logits[:, -1].float()
        scores = penalize(ids, logits + mask)
        best, runner_up = scores.topk(2).values[0].tolist()
        chosen = int(scores.argmax())
        decoded.ids.append(chosen)
        decoded.logprobs.append(float(logits.log_softmax(-1)[0, chosen]))
        decoded.margins.append(best - runner_up)
        if chosen in restrictions.stop_ids:
            break
        ids = torch.cat([ids, torch.tensor([[chosen]])], dim=1)
        out = model(input_ids=ids[:, -1:], past_key_values=out.past_key_values, use_cache=True)
    return decoded


def _mask(vocab_size: int, allowed_ids: list[int] | None) -> torch.Tensor:
    """0 on the allowed ids, -inf elsewhere (all zeros when every id is allowed)."""
    if allowed_ids is None:
        return torch.zeros(vocab_size)
    mask = torch.full((vocab_size,), float("-inf"))
    mask[allowed_ids] = 0.0
    return mask


def disagreement(reference: Decoded, ids: list[int], logprobs: list[float]
                 ) -> tuple[int | None, float]:
    """The first step whose id differs from the reference's (None: none, and as many ids), and
    the largest log-probability difference over the steps before it."""
    agreed = next((step for step, (a, b) in enumerate(zip(reference.ids, ids, strict=False))
                   if a != b), min(len(reference.ids), len(ids)))
    first = None if agreed == len(reference.ids) == len(ids) else agreed
    diffs = [abs(a - b) for a, b in zip(reference.logprobs[:agreed], logprobs[:agreed],
                                        strict=True)]
    return first, max(diffs, default=0.0)
