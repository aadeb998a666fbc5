"""The VoiceBox job queue both families share: PCM in pool blocks, abort, a dead render task.

A small real subclass renders each job as a constant tone, one job at a time, after a gate the
test opens; the pool is a real shared-memory block pool.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest

from pipeline.families.kit.queued_voicebox import QueuedVoiceBox
from pipeline.stage import StageContext, VoiceBoxJob, VoiceBoxOutput
from pipeline.tensors.shm import BlockPool

SAMPLES_PER_TOKEN = 10


class GatedVoiceBox(QueuedVoiceBox):
    """Renders a job as SAMPLES_PER_TOKEN samples of 0.5 per token, once `gate` is open."""

    task_label = "renderer"

    async def start(self, ctx: StageContext) -> None:
        self.gate = asyncio.Event()
        self.rendered: list[str] = []
        self._serve(ctx, 8_000)

    async def _render_jobs(self) -> None:
        while True:
            entry = await self.jobs.get()
            if not entry.waiting:
                continue
            await self.gate.wait()
            if entry.job.tokens == [-1]:
                raise RuntimeError("a render bug")  # kills the render task, as a bug would
            self.rendered.append(entry.job.request_id)
            entry.deliver(np.full(len(entry.job.tokens) * SAMPLES_PER_TOKEN, 0.5, np.float32))

    def _close(self) -> None:
        pass


@pytest.fixture
def pool() -> Iterator[BlockPool]:
    pool = BlockPool.create(f"omnivox-voicebox-jobs-{os.getpid()}", block_count=4,
                            block_size=1 << 12)
    yield pool
    pool.close()
    pool.unlink()


@pytest.fixture
async def voicebox(pool: BlockPool) -> AsyncIterator[GatedVoiceBox]:
    stage = GatedVoiceBox()
    await stage.start(StageContext(pool, {"max_queued": 8}, "unused"))
    yield stage
    await stage.stop()


async def _outputs(stage: GatedVoiceBox, request_id: str, tokens: list[int]) -> list:
    return [out async for out in stage.stream(VoiceBoxJob(request_id, tokens))]


async def test_jobs_render_into_pool_blocks_and_abort_drops_waiting_ones(
    voicebox: GatedVoiceBox, pool: BlockPool
) -> None:
    kept = asyncio.create_task(_outputs(voicebox, "call/a/voicebox/0", [1, 2, 3]))
    dropped = [asyncio.create_task(_outputs(voicebox, "call/b/voicebox/0", [4]))
               for _ in range(2)]
    await asyncio.sleep(0.01)  # all three are queued; the renderer waits at the gate
    assert voicebox.active_request_ids() == ["call/a/voicebox/0", "call/b/voicebox/0"]

    await voicebox.abort(["call/b/voicebox/0"])
    voicebox.gate.set()
    (out,) = await kept
    assert out.finished and out.sample_rate == 8_000
    np.testing.assert_array_equal(pool.view(out.pcm), np.full(30, 0.5, np.float32))
    pool.release(out.pcm)
    for task in dropped:
        assert await task == [VoiceBoxOutput("call/b/voicebox/0", finished=True)]
    assert voicebox.rendered == ["call/a/voicebox/0"], "aborted jobs are never rendered"
    assert voicebox.active_request_ids() == []
    assert pool.in_use == 0


async def test_a_dead_render_task_fails_waiting_jobs_and_refuses_new_ones(
    voicebox: GatedVoiceBox,
) -> None:
    killer = asyncio.create_task(_outputs(voicebox, "call/c/voicebox/0", [-1]))
    waiting = asyncio.create_task(_outputs(voicebox, "call/c/voicebox/1", [5]))
    await asyncio.sleep(0.01)
    voicebox.gate.set()  # the renderer takes the killer first and dies on it
    for task in (killer, waiting):
        with pytest.raises(RuntimeError, match="the voicebox renderer has stopped"):
            await task
    with pytest.raises(RuntimeError, match="serves no more jobs"):
        await _outputs(voicebox, "call/c/voicebox/2", [6])
    assert voicebox.active_request_ids() == []


async def test_a_job_without_tokens_is_answered_at_once_without_pcm(
    voicebox: GatedVoiceBox, pool: BlockPool
) -> None:
    """A turn's closing job (no tokens): a VoiceBox that holds nothing back answers it at
    once, empty, without queueing it (the gate stays shut) or taking a block."""
    answer = await asyncio.wait_for(_outputs(voicebox, "call/d/voicebox/end", []), 1.0)
    assert answer == [VoiceBoxOutput("call/d/voicebox/end", finished=True)]
    assert voicebox.rendered == [] and voicebox.active_request_ids() == []
    assert pool.in_use == 0
