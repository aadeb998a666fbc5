"""Qwen3-Omni's code predictor: a frame's 15 residual codes from the talker's state, batched.

A frame is 16 codes: codebook 0 (c0) from the talker's codec head, codebooks 1-15 from the
code predictor, a small dense decoder with 15 embeddings and 15 heads
(`Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration`). transformers 5.19's talker
runs it per frame (`prepare_inputs_for_generation`): a prefill of two rows, the talker's
final-norm state h and the TALKER's codec embedding of c0, whose last row's logits under head
0 give c1; then 14 one-row steps over a KV cache, step g embedding c_g with the predictor's
embedding g-1 and taking c_{g+1} from head g. Every row starts at position 0 and runs the
same 15 positions, so many calls' frames batch without padding: B rows in one forward per
position (`residual_codes`).

The talker's next input row sums the frame's 16 codebook embeddings (c0 by the talker's codec
embedding, c_g by the predictor's embedding g-1) before the side row is added (`frame_rows`).

Picking a code (`pick_codes`): greedy (the parity setting; transformers' greedy argmax), or
sampled with temperature, then top-k, then top-p, the order and rules of transformers' logits
warpers. A sampled row draws its uniforms from its own `torch.Generator`, so what a call
samples does not depend on which other calls share its batch. When sampling, the reference
runs the predictor with top-k 50 and top-p 0.8 at temperature 1 (`PREDICTOR_SAMPLING`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration as PredictorModel,
)

from pipeline.families.kit.release_tensors import release_tensors
from pipeline.families.qwen3_omni.talker_lm import talker_config

PREDICTOR_PREFIX = "talker.code_predictor."
CODEC_EMBEDDING_PREFIX = "talker.model.codec_embedding."  # the talker's, for c0
CPU = torch.device("cpu")


@dataclass(frozen=True)
class Pick:
    """How one row picks a code from its logits: greedy, or sampled at `temperature` among
    the `top_k` likeliest (0: all) and the smallest set holding `top_p` of the mass."""

    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.greedy and self.temperature <= 0:
            raise ValueError(f"a sampled pick needs a positive temperature, not {self.temperature}")
        if self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"top_k {self.top_k} (>= 0) or top_p {self.top_p} (in (0, 1])")


GREEDY = Pick()
# The reference's predictor when the talker samples (prepare_inputs_for_generation: top_k 50,
# top_p 0.8; the predictor's generation config leaves the temperature at 1)
PREDICTOR_SAMPLING = Pick(greedy=False, temperature=1.0, top_k=50, top_p=0.8)


def uniforms(generators: Sequence[torch.Generator | None], count: int) -> torch.Tensor:
    """(B, count) uniforms in [0, 1) on the CPU, row r drawn from generators[r] (zeros for a
    row without one: a greedy row draws nothing, so its generator's stream is left as is)."""
    rows = [torch.rand(count, generator=g, dtype=torch.float64) if g is not None
            else torch.zeros(count, dtype=torch.float64) for g in generators]
    return torch.stack(rows) if rows else torch.zeros(0, count, dtype=torch.float64)


def pick_probabilities(logits: torch.Tensor, picks: Sequence[Pick]) -> torch.Tensor:
    """(B, V) float32 probabilities each row samples from: logits / temperature, then the
    codes under the top_k-th largest value dropped (ties kept), then the least likely codes
    whose mass together is at most 1 - top_p dropped (the likeliest always kept)."""
    vocab = logits.shape[1]
    device = logits.device
    scaled = logits.float() / torch.tensor([p.temperature for p in picks], device=device)[:, None]
    ks = torch.tensor([min(p.top_k or vocab, vocab) for p in picks], device=device)
    descending = scaled.sort(dim=-1, descending=True).values
    kth = descending.gather(1, (ks - 1)[:, None])
    scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    top_p = torch.tensor([p.top_p for p in picks], device=device)[:, None]
    ascending, order = scaled.sort(dim=-1)
    mass = ascending.softmax(-1).cumsum(-1)
    drop = (mass <= 1 - top_p) & (top_p < 1)  # top_p 1: no such filter at all
    drop[:, -1] = False
    scaled = scaled.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return scaled.softmax(-1)


def pick_codes(logits: torch.Tensor, picks: Sequence[Pick], draws: torch.Tensor) -> torch.Tensor:
    """(B,) codes from (B, V) logits: argmax for a greedy row, else the code whose cumulative
    probability first exceeds the row's uniform in `draws` (B,)."""
    codes = logits.argmax(-1)
    sampled = [row for row, pick in enumerate(picks) if not pick.greedy]
    if not sampled:
        return codes
    rows = torch.tensor(sampled, device=logits.device)
    probabilities = pick_probabilities(logits[rows], [picks[r] for r in sampled])
    cdf = probabilities.cumsum(-1)
    targets = draws[sampled].to(logits.device, torch.float32)[:, None] * cdf[:, -1:]
    chosen = torch.searchsorted(cdf, targets, right=True).clamp_max(logits.shape[1] - 1)
    return codes.index_copy(0, rows, chosen[:, 0])


class CodePredictor:
    """The release's code predictor and the talker's codec embedding, on one device/dtype."""

    def __init__(self, model: PredictorModel, codec_embedding: nn.Embedding) -> None:
        self.model = model.eval()
        self.codec_embedding = codec_embedding
        self.groups = int(model.config.num_code_groups)  # codebooks a frame (c0 included)
        weight = codec_embedding.weight
        self.device, self.dtype = weight.device, weight.dtype

    @classmethod
    def load(cls, release: Path, device: torch.device = CPU,
             dtype: torch.dtype = torch.float32) -> CodePredictor:
        """From the release directory's tensors (`talker.code_predictor.*` and the talker's
        codec embedding); `device`/`dtype` as a stage's `Placement` names them. A clear error
        for a release whose tensors the predictor does not read as they are."""
        config = talker_config(Path(release)).code_predictor_config
        model = PredictorModel(config)
        tensors = release_tensors(Path(release), PREDICTOR_PREFIX)
        result = model.load_state_dict(tensors, strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise ValueError(f"{release}: the code predictor's tensors do not load: missing "
                             f"{sorted(result.missing_keys)}, unexpected "
                             f"{sorted(result.unexpected_keys)}")
        table = release_tensors(Path(release), CODEC_EMBEDDING_PREFIX)["weight"]
        embedding = nn.Embedding.from_pretrained(table, freeze=True)
        placed = nn.Module.to(model, device, dtype)  # (PreTrainedModel.to's wrapper: untyped)
        return cls(placed, embedding.to(device, dtype))

    @property
    def hidden_size(self) -> int:
        return int(self.codec_embedding.embedding_dim)

    @torch.inference_mode()
    def residual_codes(self, states: torch.Tensor, first: torch.Tensor, picks: Sequence[Pick],
                       generators: Sequence[torch.Generator | None]) -> torch.Tensor:
        """(B, groups - 1) codes c1.. of B frames (on the CPU), from the talker's states
        (B, hidden) and the frames' codebook-0 codes (B,): one forward per position for all
        rows. Row r picks as picks[r]; a sampled row draws from generators[r]."""
        batch = states.shape[0]
        residual = self.groups - 1
        if batch == 0:
            return torch.zeros(0, residual, dtype=torch.long)
        draws = uniforms([g if not p.greedy else None for p, g in zip(picks, generators,
                                                                      strict=True)], residual)
        decoder: Any = self.model.model
        cache = DynamicCache(config=self.model.config)
        first = first.to(self.device)
        rows = torch.stack([states.to(self.device, self.dtype), self.codec_embedding(first)], 1)
        codes = []
        for group in range(residual):
            hidden = decoder(inputs_embeds=rows, past_key_values=cache,
                             use_cache=True).last_hidden_state[:, -1]
            code = pick_codes(self.model.lm_head[group](hidden), picks, draws[:, group])
            codes.append(code)
            rows = decoder.codec_embedding[group](code)[:, None]
        return torch.stack(codes, 1).cpu()

    @torch.inference_mode()
    def frame_rows(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, hidden) float32 CPU: the sum of each frame's codebook embeddings, codes (B, groups)
        (c0 by the talker's codec embedding, c_g by the predictor's embedding g-1), summed over
        the 16 in float32 as the reference sums its stacked embeddings."""
        codes = codes.to(self.device)
        tables: Any = self.model.model.codec_embedding
        parts = [self.codec_embedding(codes[:, 0])]
        parts += [tables[group - 1](codes[:, group]) for group in range(1, self.groups)]
        return torch.stack(parts, 1).float().sum(1).cpu()
