"""The stage runtime with real worker processes, a real pool and zmq, over a test-only family.

tests/fake_family does trivial deterministic work, so these tests exercise the runtime itself:
process titles and groups, the cascade, cancel, supervision (kill -9, hangs, failed starts),
block reclaim and several clients on one worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from pipeline.errors import RequestFailedError, StageFailedError, StageStalledError
from pipeline.runtime.client import StageClient
from pipeline.runtime.supervisor import StageState
from pipeline.stage import TalkerJob, ThinkerJob
from pipeline.tensors.cuda_ipc import CudaIpcRef
from pipeline.turns.events import AudioChunk, TextDelta, Transcript, Turn, TurnDone, TurnFailed
from pipeline.turns.orchestrator import Pipeline
from tests.fake_family import HIDDEN, SAMPLE_RATE, SAMPLES_PER_TOKEN, reply_words

FAMILY = "tests.fake_family"
REPO = Path(__file__).resolve().parent.parent
KEPT_BLOCKS = 2  # the fake Thinker holds these for its lifetime
# Silence that makes a worker hung. The workers run below this process in CPU priority, and a
# beat is only heard when this process's own loop gets to it: on a shared 2-core machine
# either can lag by a second, which a 1 s timeout read as a hang (a spurious restart). 3 s
# still finds the hung worker of test_hung_worker_is_killed_and_replaced in seconds.
HEARTBEAT_TIMEOUT_S = 3.0
# The fake VoiceBox holds back a turn's last tokens while more follow (a VoiceBox rendering
# with lookahead): each turn's audio is whole only if its closing job comes.
LOOKAHEAD = 3


def settings(**stages: dict) -> dict:
    return {
        "family": FAMILY,
        "stages": {"thinker": {"token_s": 0.004, "hold_blocks": KEPT_BLOCKS},
                   "talker": {"token_s": 0.0005, "engine_child": True},
                   # a start longer than the heartbeat timeout
                   "voicebox": {"start_delay_s": HEARTBEAT_TIMEOUT_S + 0.5},
                   **stages},
        "pool": {"block_count": 64, "block_size": 1 << 16},
        "restart": {"max_attempts": 2, "backoff_s": 0.05, "heartbeat_s": 0.1,
                    "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S, "stop_timeout_s": 2.0},
    }


@pytest.fixture(scope="module")
async def pipeline() -> AsyncIterator[Pipeline]:
    async with Pipeline(settings()) as pipe:
        assert pipe.health().ready, pipe.health()
        yield pipe


def turn(turn_id: str, words: int = 20, **kw) -> Turn:
    return Turn(turn_id, [{"role": "system", "content": "be brief"},
                          {"role": "user", "content": kw.pop("say", "hi")}], max_tokens=words, **kw)


async def collect(pipe: Pipeline, t: Turn, **kw) -> list:
    return [event async for event in pipe.respond(t, **kw)]


async def until(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def ready_again(pipe: Pipeline, stage: str, old_pid: int) -> None:
    def restarted() -> bool:
        status = pipe.health().stages[stage]
        return status.state == StageState.READY and status.pid not in (None, old_pid)

    await until(restarted, what=f"{stage} restarted")


async def test_workers_have_proctitles_and_own_process_groups(pipeline: Pipeline) -> None:
    for stage, status in pipeline.health().stages.items():
        assert status.restarts == 0, status  # a slow start is not mistaken for a hang
        cmdline = Path(f"/proc/{status.pid}/cmdline").read_bytes()
        assert cmdline.split(b"\0")[0] == f"omnivox-{stage}".encode()
        assert os.getpgid(status.pid) == status.pid  # a group of its own: killed as a whole


async def test_turn_streams_text_and_audio_with_spans(pipeline: Pipeline) -> None:
    audio = (np.arange(8000) % 100).astype(np.int16)
    events = await collect(pipeline, turn("spans", 20, audio=audio))
    done = events[-1]
    assert isinstance(done, TurnDone), events[-1]
    assert [e.text for e in events if isinstance(e, Transcript)] == ["<8000 samples>"]
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == done.text == " ".join(reply_words(20))
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    spans = sorted({(c.text_start, c.text_end, c.text) for c in chunks})
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    for (start, end, chunk_text), following in zip(spans, [*spans[1:], None], strict=True):
        assert text[start:end] == chunk_text
        assert following is None or following[0] == end  # chunks tile the reply
    assert len(spans[0][2]) <= 16, "the first chunk is short"
    # The fake voice renders each speech token (a char of the chunk) as 160 equal samples.
    voiced = "".join(chr(int(v)) for c in chunks for v in c.pcm[::SAMPLES_PER_TOKEN])
    assert voiced == text
    assert done.usage["first_audio_s"] < done.usage["elapsed_s"]
    waits = done.usage["longest_wait_s"]  # each stage gave several outputs
    assert set(waits) == {"thinker", "talker", "voicebox"}, waits
    assert all(0 < wait < done.usage["elapsed_s"] for wait in waits.values()), waits
    await until(lambda: pipeline.pool.in_use == KEPT_BLOCKS, what="every block released")


@pytest.fixture(scope="module")
async def lookahead() -> AsyncIterator[Pipeline]:
    """A pipeline whose fake VoiceBox holds back each turn's last LOOKAHEAD tokens while more
    follow (its own: a first audio that short changes the timing the kill tests rely on)."""
    async with Pipeline(settings(voicebox={"lookahead_tokens": LOOKAHEAD})) as pipe:
        yield pipe


async def test_the_closing_job_voices_what_the_voicebox_held_back(lookahead: Pipeline) -> None:
    """Every group's job tells the VoiceBox that more follows; once the Talker is done, the
    turn's closing job (no tokens) gets the held-back tail, the last chunk's audio."""
    events = await collect(lookahead, turn("tail", 12))
    done = events[-1]
    assert isinstance(done, TurnDone), done
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    voiced = "".join(chr(int(v)) for c in chunks for v in c.pcm[::SAMPLES_PER_TOKEN])
    assert voiced == done.text  # every token once, in order: none left behind
    tail = chunks[-1]
    assert len(tail.pcm) == LOOKAHEAD * SAMPLES_PER_TOKEN  # the closing job's audio
    assert tail.text_end == len(done.text)
    assert done.usage["audio_s"] == pytest.approx(
        len(done.text) * SAMPLES_PER_TOKEN / SAMPLE_RATE)
    await until(lambda: lookahead.pool.in_use == KEPT_BLOCKS, what="every block released")


async def test_concurrent_turns_get_their_own_outputs(pipeline: Pipeline) -> None:
    sizes = [5 + 3 * i for i in range(8)]
    results = await asyncio.gather(*(collect(pipeline, turn(f"conc{i}", n))
                                     for i, n in enumerate(sizes)))
    for i, (events, n) in enumerate(zip(results, sizes, strict=True)):
        assert all(e.turn_id == f"conc{i}" for e in events)
        assert isinstance(events[-1], TurnDone)
        assert events[-1].text == " ".join(reply_words(n))
        assert sum(len(e.pcm) for e in events if isinstance(e, AudioChunk)) == (
            len(events[-1].text) * SAMPLES_PER_TOKEN)


async def test_sequential_mode_renders_audio_after_the_whole_text(pipeline: Pipeline) -> None:
    events = await collect(pipeline, turn("seq", 30), overlap=False)
    kinds = [type(e) for e in events]
    assert kinds[-1] is TurnDone
    assert kinds.index(AudioChunk) > max(i for i, k in enumerate(kinds) if k is TextDelta)
    cascade = await collect(pipeline, turn("casc", 30))
    kinds = [type(e) for e in cascade]
    assert kinds.index(AudioChunk) < max(i for i, k in enumerate(kinds) if k is TextDelta)


async def test_cancel_mid_turn_stops_events_and_leaves_no_request(pipeline: Pipeline) -> None:
    events = pipeline.respond(turn("cancelme", 400))
    async for event in events:
        if isinstance(event, AudioChunk):
            break
    started = time.perf_counter()
    assert await pipeline.cancel("cancelme")
    latency = time.perf_counter() - started
    print(f"\ncancel latency (fake family): {latency * 1000:.2f} ms")
    assert [e async for e in events] == []  # nothing more of that turn
    held = await pipeline.active_requests()
    assert set(held) == {"thinker", "talker", "voicebox"}
    for reply in held.values():
        assert not [r for r in reply.engine_ids + reply.serving_ids if "/cancelme/" in r]
    assert not await pipeline.cancel("cancelme")
    await until(lambda: pipeline.pool.in_use == KEPT_BLOCKS, what="every block released")


async def test_kill_worker_mid_turn_fails_turn_then_restarts(pipeline: Pipeline) -> None:
    for victim in ("thinker", "talker"):
        status = pipeline.health().stages[victim]
        engine_children = psutil.Process(status.pid).children(recursive=True)
        assert engine_children or victim == "thinker"
        events = pipeline.respond(turn(f"kill-{victim}", 400, audio=np.zeros(1600, np.int16)))
        async for event in events:
            if isinstance(event, AudioChunk):
                break
        os.kill(status.pid, signal.SIGKILL)
        rest = [e async for e in events]
        assert isinstance(rest[-1], TurnFailed), rest[-1:]
        assert isinstance(rest[-1].error, StageFailedError)
        assert rest[-1].error.stage == victim
        await ready_again(pipeline, victim, status.pid)
        assert pipeline.health().stages[victim].restarts >= 1
        for child in engine_children:  # no orphaned engine process
            assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
        # The dead Thinker's kept blocks were reclaimed: only the new one's remain.
        await until(lambda: pipeline.pool.in_use == KEPT_BLOCKS, what="dead worker's blocks")
        events = await collect(pipeline, turn(f"after-{victim}", 10))
        assert isinstance(events[-1], TurnDone) and events[-1].text == " ".join(reply_words(10))


async def test_hung_worker_is_killed_and_replaced(pipeline: Pipeline) -> None:
    old = pipeline.health().stages["thinker"].pid
    events = await collect(pipeline, turn("hang", 10, say="HANG please"))
    assert isinstance(events[-1], TurnFailed)
    assert "heartbeat" in events[-1].error.reason
    await ready_again(pipeline, "thinker", old)
    assert not psutil.pid_exists(old) or psutil.Process(old).status() == psutil.STATUS_ZOMBIE
    assert isinstance((await collect(pipeline, turn("after-hang", 5)))[-1], TurnDone)


STALL_S = 2.0  # the stall timeout of the `stalling` pipeline


@pytest.fixture(scope="module")
async def stalling() -> AsyncIterator[Pipeline]:
    """A pipeline with a short stall timeout, whose Thinker writes a word every 0.5 s."""
    slow = {"token_s": 0.5, "hold_blocks": KEPT_BLOCKS}
    async with Pipeline({**settings(thinker=slow), "stall_timeout_s": STALL_S}) as pipe:
        yield pipe


async def collect_within(pipe: Pipeline, t: Turn, timeout_s: float) -> list:
    async with asyncio.timeout(timeout_s):  # without a stall timeout: hung for good
        return await collect(pipe, t)


def assert_stalled(events: list, stage: str) -> None:
    assert isinstance(events[-1], TurnFailed), events[-1]
    error = events[-1].error
    assert isinstance(error, StageStalledError) and error.stage == stage, error
    assert f"no output for {STALL_S:g} s" in str(error) and "aborted" in str(error), error


async def test_one_stalled_request_fails_its_turn_while_the_stage_serves_on(
    stalling: Pipeline,
) -> None:
    """A request the stage took and never answers (its worker heartbeats on) fails its turn
    after the stall timeout and is aborted in the worker. The stage answered other requests
    meanwhile (a slow reply, whose words come closer together than the timeout, completes
    however long it takes in all), so the worker is left serving."""
    status = stalling.health().stages["thinker"]
    slow = asyncio.create_task(collect_within(stalling, turn("slow", 12), 60))
    await asyncio.sleep(0.3)
    stalled = await collect_within(stalling, turn("stalled", 8, say="STALL now"), STALL_S + 30)
    assert_stalled(stalled, "thinker")
    held = await stalling.active_requests()  # asked of the worker and its stage
    assert not [r for r in held["thinker"].engine_ids + held["thinker"].serving_ids
                if "/stalled/" in r], held["thinker"]
    events = await slow
    assert isinstance(events[-1], TurnDone), events[-1]
    assert events[-1].usage["elapsed_s"] > 2 * STALL_S
    # A word every 0.5 s: the Thinker's waits between outputs show it, and so do the stages
    # after it, which could voice no faster than the words came.
    waits = events[-1].usage["longest_wait_s"]
    assert min(waits.values()) >= 0.4, waits
    after = stalling.health().stages["thinker"]
    assert after.pid == status.pid and after.restarts == status.restarts, after


async def test_a_stage_that_answers_nothing_is_replaced(stalling: Pipeline) -> None:
    """A stalled request while no request of the stage got any output: the engine is stuck,
    not slow. The turn fails as a stall, the worker is replaced, the next turn is answered."""
    status = stalling.health().stages["thinker"]
    stalled = await collect_within(stalling, turn("stuck", 8, say="STALL now"), STALL_S + 30)
    assert_stalled(stalled, "thinker")
    await ready_again(stalling, "thinker", status.pid)
    replaced = stalling.health().stages["thinker"]
    assert replaced.restarts == status.restarts + 1, replaced
    assert isinstance((await collect(stalling, turn("after-stuck", 3)))[-1], TurnDone)


async def test_second_client_shares_the_worker(pipeline: Pipeline) -> None:
    endpoint = pipeline._clients["thinker"].endpoint
    other = StageClient("thinker", endpoint, pipeline.pool)
    other.connect()
    try:
        job = ThinkerJob("other/1/thinker/0", [{"role": "user", "content": "x"}], max_tokens=6)
        direct, via_pipeline = await asyncio.gather(
            _texts(other, job), collect(pipeline, turn("shared", 12)))
        assert "".join(direct) == " ".join(reply_words(6))
        assert via_pipeline[-1].text == " ".join(reply_words(12))
    finally:
        await other.close()


async def test_malformed_job_fails_its_request_instead_of_hanging(pipeline: Pipeline) -> None:
    client = pipeline._clients["thinker"]
    job = ThinkerJob("bad/1/thinker/0", [{"role": "user", "content": 42}])  # not a str
    with pytest.raises(RequestFailedError, match="ValidationError"):
        await _texts(client, job)


async def test_tensor_releases_and_unmappable_cuda_jobs_leave_workers_serving(
    pipeline: Pipeline,
) -> None:
    pids = {stage: status.pid for stage, status in pipeline.health().stages.items()}
    thinker, talker = pipeline._clients["thinker"], pipeline._clients["talker"]
    # Releases of transfers the worker never made (as after a restart): ignored, not fatal.
    thinker.release_tensors([(1 << 40) + 1, (1 << 40) + 2])
    thinker.release_tensors([(1 << 40) + 3], delivered=False)
    # A job whose CUDA IPC piece cannot be mapped (no GPU here; on a GPU host its handle is
    # made up) fails cleanly before its stage sees it.
    export = CudaIpcRef(1 << 40, "float32", (1, HIDDEN), (HIDDEN, 1), 0, 0, b"h", 4 * HIDDEN,
                        0, b"/torch_0_0", 0, None, False, "thinker")
    with pytest.raises(RequestFailedError, match="mapping its CUDA IPC tensors"):
        async for _ in talker.submit(TalkerJob("cudajob/1/talker/0", "hi", [export])):
            pass
    held = await pipeline.active_requests()
    assert not [r for reply in held.values() for r in reply.serving_ids if "cudajob" in r]
    for reply in held.values():  # nothing held, and no CUDA used by the fake stages
        assert (reply.cuda_exports_pending, reply.cuda_imports_held,
                reply.cuda_allocated_bytes) == (0, 0, 0), reply
    assert {st: s.pid for st, s in pipeline.health().stages.items()} == pids  # none broke
    events = await collect(pipeline, turn("after-releases", 8))
    assert isinstance(events[-1], TurnDone) and events[-1].text == " ".join(reply_words(8))


async def _texts(client: StageClient, job: ThinkerJob) -> list[str]:
    texts = []
    async for out in client.submit(job):
        texts.append(out.text)
        for ref in out.embeds:
            assert client.pool.view(ref).shape == (1, HIDDEN)
            client.pool.release(ref)
    return texts


API_PROCESS = """
import asyncio, json, os, sys
import psutil
from pipeline.turns.orchestrator import Pipeline
from tests.test_pipeline_runtime import settings

async def main():
    pipe = Pipeline(settings())
    await pipe.start()
    pids = [s.pid for s in pipe.health().stages.values()]
    pids += [c.pid for p in pids for c in psutil.Process(p).children(recursive=True)]
    with open(sys.argv[1] + ".part", "w") as out:
        json.dump(pids, out)
    os.rename(sys.argv[1] + ".part", sys.argv[1])
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_workers_and_engine_children_die_with_the_api_process(tmp_path: Path) -> None:
    report = tmp_path / "pids.json"  # a file, not a pipe: survivors would hold a pipe open
    api = await asyncio.create_subprocess_exec(
        sys.executable, "-c", API_PROCESS, str(report), cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        await until(report.exists, timeout=60, what="the API process's pipeline")
        pids = json.loads(report.read_text())
        assert len(pids) == 4  # three workers and the talker's 'engine' child
        procs = [psutil.Process(pid) for pid in pids]
    finally:
        api.kill()  # SIGKILL: no stop(), no atexit; only the workers' parent-death guard
        await api.wait()
    _, alive = psutil.wait_procs(procs, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


async def test_stage_failing_at_start_is_retried_then_marked_failed() -> None:
    pipe = Pipeline(settings(voicebox={"fail_start": "no voice weights in /nowhere"}))
    try:
        await pipe.start()
        health = pipe.health()
        assert not health.ready
        voicebox = health.stages["voicebox"]
        assert voicebox.state == StageState.FAILED
        assert "no voice weights in /nowhere" in voicebox.reason
        assert voicebox.restarts == 1  # max_attempts=2: one retry
        assert health.stages["thinker"].state == StageState.READY
        events = await collect(pipe, turn("refused", 5))
        assert len(events) == 1 and isinstance(events[0].error, StageFailedError)
        assert events[0].error.stage == "voicebox"
    finally:
        with contextlib.suppress(Exception):
            await pipe.stop()
