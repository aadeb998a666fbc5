"""Workers lost after a good start count toward `restart.max_attempts` (real fake-family workers).

A worker that starts, then dies or hangs before serving any request, is a crash loop: restarted
with the doubling back-off, then given up (`failed`, with the reason). A lost worker that had
served a request starts the count again, so a stage that serves between losses is never given up.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import AsyncIterator

import pytest

from pipeline.errors import StageFailedError
from pipeline.runtime.supervisor import StageState
from pipeline.turns.events import TurnDone, TurnFailed
from pipeline.turns.orchestrator import Pipeline
from tests.test_pipeline_runtime import collect, turn, until

FAMILY = "tests.fake_family"
MAX_ATTEMPTS = 3
BACKOFF_S = 0.1
WAIT_S = 60.0  # for a supervisor's decision; they come within a few seconds


def settings() -> dict:
    return {
        "family": FAMILY,
        "pool": {"block_count": 32, "block_size": 1 << 16},
        "restart": {"max_attempts": MAX_ATTEMPTS, "backoff_s": BACKOFF_S, "heartbeat_s": 0.05,
                    "heartbeat_timeout_s": 1.0, "starved_grace_s": 0.0, "stop_timeout_s": 2.0},
    }


@pytest.fixture
async def pipeline() -> AsyncIterator[Pipeline]:
    async with Pipeline(settings()) as pipe:
        assert pipe.health().ready, pipe.health()
        yield pipe


async def restarted(pipe: Pipeline, stage: str, old_pid: int) -> int:
    """Wait until `stage` runs a new worker, ready; its pid."""
    def ready() -> bool:
        status = pipe.health().stages[stage]
        return status.state == StageState.READY and status.pid not in (None, old_pid)

    await until(ready, WAIT_S, f"{stage} restarted")
    return pipe.health().stages[stage].pid


def backoffs(caplog: pytest.LogCaptureFixture, stage: str) -> list[float]:
    """The back-offs the supervisor waited before each restart of `stage`, in order."""
    pattern = re.compile(rf"stage {stage}: restart \d+ in ([\d.]+) s")
    return [float(m.group(1)) for r in caplog.records if (m := pattern.search(r.getMessage()))]


async def test_workers_lost_before_serving_give_the_stage_up(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture,
) -> None:
    """Workers that die (kill -9), then one that hangs (SIGSTOP), none having served a
    request: restarted after backoff_s, then twice that, then the stage is given up."""
    caplog.set_level(logging.INFO, logger="pipeline.runtime.supervisor")
    pid = pipeline.health().stages["voicebox"].pid
    for _ in range(MAX_ATTEMPTS - 1):
        os.kill(pid, signal.SIGKILL)
        pid = await restarted(pipeline, "voicebox", pid)
    os.kill(pid, signal.SIGSTOP)
    await until(lambda: pipeline.health().stages["voicebox"].state == StageState.FAILED,
                WAIT_S, "the voicebox given up")
    status = pipeline.health().stages["voicebox"]
    print(f"\n{status.reason}")
    assert "hung" in status.reason, status
    assert f"({MAX_ATTEMPTS} lost with no request served in between)" in status.reason, status
    assert status.restarts == MAX_ATTEMPTS - 1 and status.pid is None, status
    assert backoffs(caplog, "voicebox") == [BACKOFF_S * 2 ** i for i in range(MAX_ATTEMPTS - 1)]
    events = await collect(pipeline, turn("refused", 5))
    assert isinstance(events[-1], TurnFailed), events
    assert isinstance(events[-1].error, StageFailedError) and events[-1].error.stage == "voicebox"
    assert pipeline.health().stages["thinker"].state == StageState.READY  # only that stage


async def test_a_stage_that_serves_between_losses_is_always_restarted(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pipeline.runtime.supervisor")
    losses = MAX_ATTEMPTS + 2
    for i in range(losses):
        events = await collect(pipeline, turn(f"served-{i}", 5))
        assert isinstance(events[-1], TurnDone), events[-1]
        status = pipeline.health().stages["thinker"]
        await until(lambda: pipeline.health().stages["thinker"].served > 0, WAIT_S,
                    "the Thinker's heartbeat to count the served request")
        os.kill(status.pid, signal.SIGKILL)
        await restarted(pipeline, "thinker", status.pid)
    status = pipeline.health().stages["thinker"]
    assert status.state == StageState.READY and status.restarts == losses, status
    assert backoffs(caplog, "thinker") == [BACKOFF_S] * losses  # each loss the first in a row
    events = await collect(pipeline, turn("after", 5))
    assert isinstance(events[-1], TurnDone), events[-1]
