"""`omnivox bench pipeline`: what the cascade and the runtime buy, measured on a live pipeline.

- cascade_vs_sequential: time to the first AudioChunk of a long reply with the stages
  overlapping, and with each stage run to its end before the next (the median of `repeats`);
- concurrency: turns completed per second with 1, 8, 32 turns started at once;
- shm_vs_pickle: moving one tensor between processes through the pool versus pickling it; the
  headline (`shm_inplace_s`, `inplace_ratio`) is the product's own path: a leased block written
  in place, its ref sent, the consumer reading a view; beside it the same round trip after an
  equal wait with nothing written (`shm_pause_s`), which shows what its growth with size is
  (`transport.py`).
Figures are printed and returned; none is asserted (they depend on the machine).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import numpy as np

from agent.bench.transport import DEFAULT_SIZES, shm_vs_pickle
from pipeline.settings import PipelineSettings
from pipeline.turns.events import AudioChunk, Turn, TurnDone
from pipeline.turns.orchestrator import Pipeline

MESSAGES = [{"role": "system", "content": "You are a friendly voice assistant."},
            {"role": "user", "content": "Tell me about the opening hours of the library."}]


async def run_turn(pipe: Pipeline, turn_id: str, tokens: int, overlap: bool = True,
                   audio: np.ndarray | None = None, recite: str | None = None) -> float:
    """Run one turn (with the caller's `audio`, int16 at 16 kHz, if given; the reply `recite`d
    instead of written, if given) to its end; seconds from its start to its first audio."""
    began, first_audio = time.perf_counter(), None
    turn = Turn(turn_id, MESSAGES, audio=audio, max_tokens=tokens, recite=recite)
    async for event in pipe.respond(turn, overlap=overlap):
        if isinstance(event, AudioChunk) and first_audio is None:
            first_audio = time.perf_counter() - began
        last = event
    if not isinstance(last, TurnDone):
        raise RuntimeError(f"benchmark turn {turn_id} failed: {last}")
    return first_audio if first_audio is not None else float("nan")


async def cascade_vs_sequential(pipe: Pipeline, tokens: int = 100, repeats: int = 3) -> dict:
    """First-audio time of a `tokens`-long reply, overlapped and sequential (medians)."""
    cascade, sequential = [], []
    for i in range(repeats):  # interleaved, so a slow moment of the machine hits both
        cascade.append(await run_turn(pipe, f"bench-cascade-{i}", tokens, overlap=True))
        sequential.append(await run_turn(pipe, f"bench-sequential-{i}", tokens, overlap=False))
    c, s = statistics.median(cascade), statistics.median(sequential)
    return {"reply_tokens": tokens, "cascade_first_audio_s": round(c, 4),
            "sequential_first_audio_s": round(s, 4), "ratio": round(s / c, 2)}


async def concurrency(pipe: Pipeline, counts: tuple[int, ...] = (1, 8, 32),
                      tokens: int = 32) -> list[dict]:
    """Turns per second with `n` turns (each `tokens` long) started at once, for each n."""
    rows = []
    for n in counts:
        began = time.perf_counter()
        firsts = await asyncio.gather(*(run_turn(pipe, f"bench-conc{n}-{i}", tokens)
                                       for i in range(n)))
        wall = time.perf_counter() - began
        rows.append({"turns": n, "reply_tokens": tokens, "wall_s": round(wall, 3),
                     "turns_per_s": round(n / wall, 2),
                     "median_first_audio_s": round(statistics.median(firsts), 4)})
    return rows


async def bench_pipeline(settings: PipelineSettings | dict[str, Any], *, tokens: int = 100,
                         repeats: int = 3, counts: tuple[int, ...] = (1, 8, 32),
                         concurrency_tokens: int = 32,
                         shm_sizes: list[int] | None = None) -> dict[str, Any]:
    """The `omnivox bench pipeline` figures, on a pipeline started from `settings`."""
    async with Pipeline(settings) as pipe:
        if not pipe.health().ready:
            raise RuntimeError(f"pipeline not ready: {pipe.health().stages}")
        await run_turn(pipe, "bench-warm-up", 8)  # first requests pay one-time engine costs
        result: dict[str, Any] = {
            "cascade_vs_sequential": await cascade_vs_sequential(pipe, tokens, repeats),
            "concurrency": await concurrency(pipe, counts, concurrency_tokens),
        }
    sizes = shm_sizes if shm_sizes is not None else DEFAULT_SIZES
    result["shm_vs_pickle"] = await asyncio.to_thread(shm_vs_pickle, sizes)
    return result


def run_bench(settings: PipelineSettings | dict[str, Any], **options: Any) -> dict[str, Any]:
    """Blocking entry point for the CLI: `bench_pipeline` in a fresh event loop."""
    return asyncio.run(bench_pipeline(settings, **options))
