"""A silent stage worker starved of CPU is left running; a hung one is replaced (real processes).

Starved: the fake Thinker keeps its event loop busy ("BUSY", tests/fake_family/busy.py) while
its worker's main thread is pinned to one core at the lowest priority beside two CPU hogs.
Hung: a worker stopped with SIGSTOP and never continued. The tests wait for the supervisor's
decisions (its log) rather than for times.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from pipeline.runtime.supervisor import StageState
from pipeline.stage import ThinkerJob
from pipeline.turns.orchestrator import Pipeline
from tests.test_pipeline_runtime import until

FAMILY = "tests.fake_family.busy"
TIMEOUT_S = 2.0  # heartbeat timeout
HOGS = 2  # each at nice 0 against the worker's 19: it gets under 1% of their core
STEPS = 60  # of STEP_CPU_S each: 6 s of CPU, far more under starvation
WAIT_S = 120.0  # for a decision of the supervisor; they come within seconds


def settings(grace_s: float) -> dict:
    return {
        "family": FAMILY,
        "pool": {"block_count": 32, "block_size": 1 << 16},
        "stall_timeout_s": 600.0,  # a starved job's outputs come slowly: not a stall here
        "restart": {"max_attempts": 3, "backoff_s": 0.05, "heartbeat_s": 0.05,
                    "heartbeat_timeout_s": TIMEOUT_S, "starved_grace_s": grace_s,
                    "stop_timeout_s": 2.0},
    }


async def lowest_priority(pid: int) -> None:
    """Nice 19 for the process and for its scheduling autogroup (where the kernel has them,
    CPU time is shared between autogroups first, so the process's own nice value is not
    enough against hogs in other sessions)."""
    os.setpriority(os.PRIO_PROCESS, pid, 19)
    autogroup = Path(f"/proc/{pid}/autogroup")
    if not autogroup.exists():
        return
    for _ in range(100):  # unprivileged writers get one change per 100 ms, system-wide
        try:
            autogroup.write_text("19")
            return
        except BlockingIOError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"could not lower the autogroup of {pid}")


@contextlib.asynccontextmanager
async def starved(pid: int) -> AsyncIterator[None]:
    """`pid`'s main thread (its event loop) starved of CPU: pinned to one core at the lowest
    priority, beside CPU hogs pinned there too (each in a session, and autogroup, of its own)."""
    core = max(os.sched_getaffinity(0))
    await lowest_priority(pid)
    os.sched_setaffinity(pid, {core})
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(HOGS)]
    try:
        for hog in hogs:
            os.sched_setaffinity(hog.pid, {core})
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(pid, os.sched_getaffinity(0))


async def busy(pipe: Pipeline, name: str, steps: int) -> list[str]:
    """A Thinker job that keeps the worker's event loop busy for `steps` steps; its texts."""
    job = ThinkerJob(f"{name}/1/thinker/0", [{"role": "user", "content": f"BUSY {steps}"}],
                     max_tokens=steps)
    return [out.text async for out in pipe._clients["thinker"].submit(job)]


async def replaced(pipe: Pipeline, stage: str, old_pid: int) -> None:
    """Wait until `stage` runs a new worker, ready."""
    def ready() -> bool:
        status = pipe.health().stages[stage]
        return status.state == StageState.READY and status.pid not in (None, old_pid)

    await until(ready, WAIT_S, f"{stage} replaced")


def decisions(caplog: pytest.LogCaptureFixture, stage: str, words: str) -> list[str]:
    """The supervisor's log lines about `stage` that contain `words`."""
    return [r.getMessage() for r in caplog.records
            if r.name == "pipeline.runtime.supervisor" and f"stage {stage}" in r.getMessage()
            and words in r.getMessage()]


@pytest.fixture
async def patient() -> AsyncIterator[Pipeline]:
    """A pipeline that gives a starved worker far longer than these tests take."""
    async with Pipeline(settings(grace_s=600.0)) as pipe:
        yield pipe


async def test_a_starved_worker_is_left_running(
    patient: Pipeline, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pipeline.runtime.supervisor")
    before = patient.health().stages["thinker"]
    job = asyncio.create_task(busy(patient, "starved", STEPS))
    async with starved(before.pid):
        await until(lambda: decisions(caplog, "thinker", "starved of CPU, not hung"),
                    WAIT_S, "the supervisor to find the Thinker starved")
        print(f"\n{decisions(caplog, 'thinker', 'starved')[0]}")
    texts = await job  # given the CPU back, the job completes in the same worker
    assert texts[:-1] == [f" {step}" for step in range(STEPS)]
    after = patient.health().stages["thinker"]
    assert (after.pid, after.restarts) == (before.pid, before.restarts), after
    assert not decisions(caplog, "thinker", "killed"), caplog.text


async def test_a_stopped_worker_is_hung_and_replaced(
    patient: Pipeline, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pipeline.runtime.supervisor")
    before = patient.health().stages["talker"]
    os.kill(before.pid, signal.SIGSTOP)  # never continued: the supervisor's SIGKILL ends it
    await replaced(patient, "talker", before.pid)
    [verdict] = decisions(caplog, "talker", "hung")
    print(f"\n{verdict}")
    assert "state T" in verdict and "killed" in verdict, verdict
    assert not decisions(caplog, "talker", "starved")
    assert not psutil.pid_exists(before.pid) or (
        psutil.Process(before.pid).status() == psutil.STATUS_ZOMBIE)


async def test_a_worker_starved_past_the_grace_is_replaced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pipeline.runtime.supervisor")
    async with Pipeline(settings(grace_s=1.0)) as pipe:
        before = pipe.health().stages["thinker"]
        job = asyncio.create_task(busy(pipe, "too-long", 1000))
        try:
            async with starved(before.pid):
                await replaced(pipe, "thinker", before.pid)
        finally:
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)
        assert decisions(caplog, "thinker", "starved of CPU, not hung"), caplog.text
        [lost] = decisions(caplog, "thinker", "past the 1 s grace")
        print(f"\n{lost}")
        assert "killed" in lost


async def test_a_held_up_supervisor_does_not_take_its_own_silence_for_the_workers(
    patient: Pipeline, caplog: pytest.LogCaptureFixture,
) -> None:
    """The supervisor's own loop blocked past the heartbeat timeout (as a synchronous caller
    sharing it blocks it) leaves the beats sent meanwhile unread: no worker is judged hung for
    that, and none is replaced."""
    caplog.set_level(logging.WARNING, logger="pipeline.runtime.supervisor")
    before = {stage: status.pid for stage, status in patient.health().stages.items()}
    time.sleep(TIMEOUT_S * 3)  # blocks this loop, the supervisor's: deliberately
    await asyncio.sleep(TIMEOUT_S * 2)  # rounds enough to judge, had the silence counted
    after = {stage: status.pid for stage, status in patient.health().stages.items()}
    assert after == before
    assert not [r for r in caplog.records if "killed" in r.getMessage()], caplog.text
    assert all(decisions(caplog, stage, "held up") for stage in before), caplog.text
