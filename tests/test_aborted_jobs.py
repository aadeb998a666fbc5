"""Aborted jobs in a stage worker, on real worker processes (tests/fake_family): a job whose
input block went back to the pool before it read it ends quietly when its turn was cancelled
(the turn frees its jobs' blocks before their abort reaches the worker), and fails loudly,
naming why, when nobody gave it up; a question asked after an abort is answered after it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pipeline.errors import RequestFailedError
from pipeline.runtime.client import StageClient
from pipeline.stage import TalkerJob, ThinkerJob
from pipeline.tensors.shm import BlockRef
from pipeline.turns.orchestrator import Pipeline
from tests.fake_family import HIDDEN
from tests.test_pipeline_runtime import settings


async def released_ref(pipe: Pipeline) -> BlockRef:
    """A block written for a job and given back before anyone read it."""
    assert pipe.pool is not None
    ref = await pipe.pool.put(np.zeros((1, HIDDEN), np.float32), 1.0)
    pipe.pool.release(ref)
    return ref


async def drain(client: StageClient, job: TalkerJob | ThinkerJob) -> int:
    return len([out async for out in client.submit(job)])


async def worker_says(capfd: pytest.CaptureFixture[str], seen: list[str], text: str) -> None:
    """Wait until the workers' stderr (logs) has said `text`; what was read lands in `seen`."""
    for _ in range(1500):  # the workers run niced below this process: allow 30 s
        seen.append(capfd.readouterr().err)
        if text in "".join(seen):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the workers never logged {text!r}: {''.join(seen)[-2000:]}")


async def test_a_job_whose_input_was_released_unread_ends_quietly_only_if_aborted(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Started here, inside capfd: the workers' stderr is what the test reads.
    async with Pipeline({**settings(voicebox={}), "log_level": "DEBUG"}) as pipe:
        talker, logs = pipe._clients["talker"], []

        # A cancelled turn's job: the worker finds its block gone, then the abort comes.
        job = TalkerJob("gone/1/talker/0", "hi", [await released_ref(pipe)])
        outputs = asyncio.create_task(drain(talker, job))
        await worker_says(capfd, logs, f"{job.request_id}: its input was released unread")
        await talker.abort([job.request_id])  # acknowledged once the job's task has ended
        assert await outputs == 0
        await worker_says(capfd, logs, "abort of 1 requests (1 jobs)")
        quiet = [line for line in "".join(logs).splitlines() if job.request_id in line]
        assert not [line for line in quiet if " ERROR " in line], quiet

        # The same loss with nobody aborting the job: the request fails, and the worker says so.
        job = TalkerJob("live/1/talker/0", "hi", [await released_ref(pipe)])
        with pytest.raises(RequestFailedError, match="StaleBlockError"):
            await drain(talker, job)
        await worker_says(capfd, logs, f"ERROR pipeline.runtime.worker: {job.request_id} failed: "
                                       "its input was released unread")
        assert "Traceback" in "".join(logs)


async def test_what_a_worker_holds_is_told_after_the_abort_before_the_question() -> None:
    async with Pipeline(settings(voicebox={})) as pipe:
        thinker = pipe._clients["thinker"]
        # A request the fake Thinker holds, as an engine does, until it is aborted.
        job = ThinkerJob("held/1/thinker/0", [{"role": "user", "content": "STALL"}])
        outputs = asyncio.create_task(drain(thinker, job))
        for _ in range(1500):
            if job.request_id in (await thinker.inspect()).engine_ids:
                break
        else:
            raise AssertionError("the fake Thinker never took the request")
        aborted = asyncio.ensure_future(thinker.abort([job.request_id]))
        await asyncio.sleep(0)  # the abort's task runs up to its send: it leaves first
        held = await thinker.inspect()  # asked at once, answered once the abort is done
        assert job.request_id not in held.engine_ids + held.serving_ids, held
        await aborted
        assert await outputs == 0
