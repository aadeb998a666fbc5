"""The stall timeout on a real engine (docs/operations.md, Faults): the tiny Talker's vLLM
engine core is
stopped (SIGSTOP) mid-reply, in a worker that still heartbeats. With a 5 s `stall_timeout_s` the
turn fails with StageStalledError: the caller gets an `error` event naming the stage and
`response.done` failed, the call stays up. No other Talker request got outputs meanwhile, so
the engine is stuck, not slow: the worker is replaced, and the next turn is answered.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from agent.app import create_app
from agent.config import ConversationSettings, Settings
from agent.profiles import build_pipeline
from pipeline.runtime.supervisor import StageState
from tests.conftest import wait_ready
from tests.product_calls import assert_valid_events, connect, say, wait_until
from tests.served import Served, serve

pytestmark = pytest.mark.engines

STALL_S = 5.0
HANG_GUARD_S = 120.0  # only keeps a broken test from hanging
RESTART_S = 300.0  # a Talker restart on a loaded 2-core machine: 20-60 s, more when shared


@pytest.fixture(scope="module")
async def stall_server(tiny_models_dir: Path, tmp_path_factory: pytest.TempPathFactory
                       ) -> AsyncIterator[Served]:
    settings = Settings(
        profile="tiny", models_dir=tiny_models_dir, data_dir=tmp_path_factory.mktemp("data"),
        conversation=ConversationSettings(max_reply_tokens=300),  # still talking when stopped
    )
    pipeline = build_pipeline(settings, {
        "stall_timeout_s": STALL_S,
        "restart": {"backoff_s": 0.2, "start_timeout_s": 240.0},
    })
    async with serve(create_app(settings, pipeline=pipeline)) as served:
        await wait_ready(served)
        yield served


async def test_a_stopped_talker_engine_fails_the_turn_and_is_replaced(
    stall_server: Served,
) -> None:
    pipeline = stall_server.app.state.pipeline
    talker = pipeline.health().stages["talker"]
    worker = psutil.Process(talker.pid)
    cores = [p for p in worker.children(recursive=True) if p.name() == "VLLM::EngineCore"]
    assert len(cores) == 1, worker.children(recursive=True)
    caller = await connect(stall_server.url)
    stopped = False
    try:
        say(caller, "Tell me a long story.")
        await caller.wait_for("output_audio_buffer.started", timeout=HANG_GUARD_S)
        os.kill(cores[0].pid, signal.SIGSTOP)
        stopped, stopped_at = True, time.monotonic()
        done = await caller.wait_for("response.done", timeout=HANG_GUARD_S)
        failed_after = time.monotonic() - stopped_at
        assert done["response"]["status"] == "failed", done
        errors = [e for e in caller.of_type("error") if e["error"]["code"] == "response_failed"]
        assert len(errors) == 1, caller.of_type("error")
        message = errors[0]["error"]["message"]
        assert "talker" in message and "output" in message, message  # the stage, and why
        print(f"\n[stall] turn failed {failed_after:.1f} s after the engine core was stopped "
              f"(stall_timeout_s {STALL_S:g}): {message}")
        assert failed_after >= STALL_S - 0.5  # not failed by anything quicker than the stall
        # Nothing else of the Talker got outputs: a stuck engine, the worker replaced.
        await wait_until(lambda: pipeline.health().stages["talker"].pid != talker.pid,
                         HANG_GUARD_S, "the stuck Talker's worker to be replaced")
        with contextlib.suppress(ProcessLookupError):  # killed with its worker, or not yet
            os.kill(cores[0].pid, signal.SIGCONT)
        stopped = False
        assert caller.channel.readyState == "open"  # the call stays up
        assert stall_server.app.state.calls.get(caller.location.rsplit("/", 1)[1]) is not None
        await wait_until(lambda: pipeline.health().stages["talker"].state == StageState.READY,
                         RESTART_S, "the Talker back")
        assert pipeline.health().stages["talker"].restarts == talker.restarts + 1
        assert not cores[0].is_running() or cores[0].status() == psutil.STATUS_ZOMBIE
        say(caller, "And now?")
        again = await caller.wait_for("response.done", timeout=HANG_GUARD_S, count=2)
        assert again["response"]["status"] == "completed", again
        assert_valid_events(caller)
    finally:
        if stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(cores[0].pid, signal.SIGCONT)
        await caller.hang_up()
