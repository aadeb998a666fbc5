"""Seeded requests on a real CPU engine: many at once, with prompts long enough to be chunked.

vLLM 0.32 rewinds a seeded request's generator when it discards a partial prefill's token, and
a CPU generator cannot rewind: the engine core died ("CPU Generator does not use offset") and
every request failed with EngineDeadError. `VllmEngine` now drops per-request seeds on a CPU.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator

import pytest

from pipeline.engines.vllm import Delta, EngineSettings, Sampling, VllmEngine
from pipeline.families.kit.engine_stage import ENGINE_DEFAULTS
from pipeline.families.tiny import build_tiny

pytestmark = pytest.mark.engines

BATCHED_TOKENS = 64  # tokens per engine step: a longer prompt is prefilled in several steps
PROMPT_TOKENS = 200
REQUESTS = 32
REPLY_TOKENS = 8


@pytest.fixture(scope="module")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VllmEngine]:
    """The tiny Thinker's LLM on one CPU engine with a small step budget (chunked prefills)."""
    family = build_tiny(tmp_path_factory.mktemp("models"), progress=False)
    settings = EngineSettings.from_mapping({
        **ENGINE_DEFAULTS, "model": str(family / "thinker"), "max_model_len": 512,
        "max_num_seqs": 16, "max_num_batched_tokens": BATCHED_TOKENS})
    started = await VllmEngine.start(settings)
    yield started
    await started.stop()


async def _reply(engine: VllmEngine, request_id: str, prompt: list[int], seed: int) -> list[int]:
    sampling = Sampling(max_tokens=REPLY_TOKENS, temperature=1.0, seed=seed, ignore_eos=True)
    tokens: list[int] = []
    last: Delta | None = None
    async for last in engine.generate(request_id, prompt, sampling):
        tokens += last.token_ids
    assert last is not None and last.finished, f"{request_id} ended without a finished output"
    return tokens


async def test_seeded_chunked_requests_leave_a_cpu_engine_serving(
    engine: VllmEngine, caplog: pytest.LogCaptureFixture,
) -> None:
    assert engine.on_cpu, "this regression needs a CPU engine"
    rng, vocab = random.Random(7), len(engine.tokenizer)
    prompts = [[rng.randrange(vocab) for _ in range(PROMPT_TOKENS)]
               for _ in range(REQUESTS)]
    assert PROMPT_TOKENS > BATCHED_TOKENS  # so every prompt's prefill is cut into steps
    with caplog.at_level(logging.INFO, logger="pipeline.engines.vllm"):
        async with asyncio.timeout(120):  # a dead engine fails fast; a hang must fail too
            replies = await asyncio.gather(
                *(_reply(engine, f"seeded-{i}", prompt, seed=7 + i)
                  for i, prompt in enumerate(prompts)),
                return_exceptions=True)
    errors = [r for r in replies if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} of {REQUESTS} requests failed, first: {errors[0]!r}"
    assert all(len(r) == REPLY_TOKENS for r in replies), [len(r) for r in replies]
    assert engine.failure() is None
    dropped = [r for r in caplog.records if "per-request seeds are ignored" in r.getMessage()]
    assert len(dropped) == 1, "the dropped seed is logged once per engine"
