"""What the tests of converted LM directories share (test_qwen3_omni_thinker.py,
test_qwen3_omni_talker_lm.py): a vLLM engine serving one for a test module, fed prompt
embeddings, and its greedy tokens; the check that a weightless release converts into a
weightless LM of the same tensors; and pieces of a Qwen3-MoE LM to drop, which its logit
comparison must see.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import Qwen3MoeForCausalLM

from pipeline.engines.vllm import EngineSettings, Sampling, VllmEngine
from pipeline.families.kit.engine_stage import ENGINE_DEFAULTS
from tests.stage_fixtures import print_figure

WEIGHTS = "model.safetensors"


@asynccontextmanager
async def started_engine(settings: EngineSettings, tag: str,
                         figure: str = "engine start") -> AsyncIterator[VllmEngine]:
    """A vLLM engine started with `settings` (its start time printed as `figure` under `tag`),
    stopped on leaving."""
    began = time.perf_counter()
    engine = await VllmEngine.start(settings)
    print_figure(tag, figure, time.perf_counter() - began, "s")
    try:
        yield engine
    finally:
        await engine.stop()


@asynccontextmanager
async def embeds_engine(model: Path, tag: str, figure: str = "engine start",
                        **settings: Any) -> AsyncIterator[VllmEngine]:
    """The converted LM `model` on one CPU engine, fed prompt embeddings, no tokenizer (256
    positions, 4 sequences at once; `settings` added), stopped on leaving."""
    async with started_engine(EngineSettings.from_mapping({
            **ENGINE_DEFAULTS, "model": str(model), "skip_tokenizer_init": True,
            "max_model_len": 256, "max_num_seqs": 4, **settings}), tag, figure) as engine:
        yield engine


async def greedy_tokens(engine: VllmEngine, request_id: str, embeds: torch.Tensor, count: int,
                        tag: str) -> list[int]:
    """vLLM's `count` greedy tokens after the prompt `embeds` (EOS ignored), their time printed
    under `tag`."""
    sampling = Sampling(max_tokens=count, ignore_eos=True, detokenize=False)
    tokens: list[int] = []
    began = time.perf_counter()
    async for delta in engine.generate(request_id, embeds, sampling):
        tokens += delta.token_ids
    print_figure(tag, f"vLLM {count} greedy tokens", time.perf_counter() - began, "s")
    return tokens


def assert_weightless_copy(real: Path, dummy: Path) -> None:
    """The LM directory `dummy`, converted from a weightless release, holds the files of `real`
    (the same LM from the real release) and its tensors' names, shapes and dtypes, the data a
    hole: zeros, in a sparse file."""
    with safe_open(real / WEIGHTS, "pt") as a, safe_open(dummy / WEIGHTS, "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        for name in a.keys():  # noqa: SIM118 (safe_open is no mapping)
            assert a.get_slice(name).get_shape() == b.get_slice(name).get_shape()
            assert a.get_slice(name).get_dtype() == b.get_slice(name).get_dtype()
        assert not b.get_tensor("model.norm.weight").any()
    written = (dummy / WEIGHTS).stat()
    assert written.st_blocks * 512 < written.st_size // 4, "a sparse file"
    assert {p.name for p in dummy.iterdir()} == {p.name for p in real.iterdir()}


def reset_q_norm(lm: Qwen3MoeForCausalLM) -> None:
    """A dropped piece: the first layer's query norm back to ones."""
    lm.model.layers[0].self_attn.q_norm.weight.fill_(1.0)


def swap_two_experts(lm: Qwen3MoeForCausalLM) -> None:
    """A dropped piece: the second layer's first two routed experts swapped."""
    experts = lm.model.layers[1].mlp.experts
    for weights in (experts.gate_up_proj, experts.down_proj):
        weights.copy_(weights[[1, 0, 2, 3]])
