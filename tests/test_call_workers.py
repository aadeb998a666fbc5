"""Call workers (`serve --call-workers 2`, agent/calls/workers.py): two real WebRTC calls land
on different worker processes, both on the one shared tiny pipeline; each call's later requests
(its sideband, its DELETE) reach its worker; a worker killed with SIGKILL ends only its own call
(recorded `call_worker_died`) while the other goes on, and the worker is started again; a
resumed call reaches the worker that held it. Realtime calls over the WebSocket (the `openai`
SDK's `realtime.connect`) land on the workers too, least loaded first, relayed by the front,
and one whose worker dies is closed (1011) rather than left hanging."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import websockets
from openai.resources.realtime.realtime import AsyncRealtimeConnection
from websockets.asyncio.client import connect as ws_connect

from agent.app import create_app
from agent.bench.scaling import scaling, scaling_table
from agent.bench.server import histogram_quantile, parse_samples
from agent.bench.speech import resample
from agent.calls.signalling import RESUME_HEADER
from agent.calls.workers import DIED, CallWorkers, shifted_percent
from agent.config import ConversationSettings, Settings, default_call_workers
from agent.ops.metrics_merge import merged
from agent.serving.attached import follow_splits
from agent.serving.registry import ModelRegistry, Split
from tests.product_calls import LOUD, connect, say, spoken, wait_until
from tests.rtc_client import ArrayAudioTrack, RtcCaller
from tests.served import Served, serve
from tests.test_openai_sdk_realtime import MANUAL, RATE, append, audio_of, until


def test_default_call_workers_follows_the_cores() -> None:
    assert [default_call_workers(n) for n in (1, 2, 4, 7, 8, 12, 16, 32, 64)] == [
        1, 1, 1, 1, 2, 3, 4, 8, 8]
    with pytest.raises(ValueError, match="call_workers"):
        Settings(call_workers=0)


def test_a_red_black_shift_splits_the_workers_calls_as_the_fronts() -> None:
    """The front sends each worker the share a shift gives each version; the worker's registry
    then splits its new callers the same way, and stops when the shift ends."""
    front, worker = ModelRegistry("tiny"), ModelRegistry("tiny")
    versions = [SimpleNamespace(name="tiny", version=v) for v in ("1", "2")]

    def sent() -> list[dict[str, Any]]:
        return [{"name": v.name, "version": v.version,
                 "shifted_percent": shifted_percent(front, v)} for v in versions]

    front.split("tiny", "2", 30)
    follow_splits(worker, sent())
    assert worker.shifted("tiny") == Split("2", 30)
    front.split("tiny", None)
    follow_splits(worker, sent())
    assert worker.shifted("tiny") is None


def test_metrics_of_the_workers_add_up_under_their_label() -> None:
    def exposition(lateness_s: list[float]) -> str:
        from prometheus_client import CollectorRegistry, Histogram, generate_latest

        registry = CollectorRegistry()
        late = Histogram("late_seconds", "lateness", registry=registry,
                         buckets=(0.01, 0.02, 0.05, 0.1))
        for value in lateness_s:
            late.observe(value)
        return generate_latest(registry).decode()

    text = merged(exposition([]).encode(), {"0": exposition([0.005] * 98),
                                            "1": exposition([0.08] * 2)}).decode()
    assert text.count("# HELP late_seconds ") == 1  # one family, three sources
    assert 'call_worker="1"' in text
    samples = parse_samples(text)
    assert samples[("late_seconds_count", (("call_worker", "0"),))] == 98
    p99 = histogram_quantile(0.99, {}, samples, "late_seconds")  # both workers' together
    assert p99 is not None and 0.05 < p99 <= 0.1


@pytest.fixture
async def front(tiny_server: Served, tmp_path: Path) -> AsyncIterator[Served]:
    """A server with two call workers on the shared tiny pipeline (never a second one)."""
    pipeline = tiny_server.app.state.pipeline
    settings = Settings(profile="tiny", models_dir=pipeline.settings.models_dir,
                        data_dir=tmp_path / "data", call_workers=2, max_calls=4,
                        conversation=ConversationSettings(max_reply_tokens=24))
    app = create_app(settings, pipeline=pipeline, owns_pipeline=False)
    async with serve(app) as served:
        await wait_until(lambda: len(workers(served).by_load()) == 2, 120, "two workers up")
        yield served


def workers(served: Served) -> CallWorkers:
    return served.app.state.call_workers


def call_id(caller: RtcCaller) -> str:
    assert caller.location is not None
    return caller.location.rsplit("/", 1)[1]


async def answered(caller: RtcCaller, text: str, count: int) -> None:
    """The caller asks by text and hears the agent's reply (its `count`-th)."""
    heard = len(caller.received)
    say(caller, text)
    done = await caller.wait_for("response.done", timeout=120, count=count)
    assert done["response"]["status"] == "completed", done
    await wait_until(lambda: any(np.abs(f).max() > LOUD for f in caller.received[heard:]),
                     30, "the reply's audio")


async def record(served: Served, call: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=served.url) as http:
        return (await http.get(f"/v1/calls/{call}")).json()


@pytest.mark.engines
async def test_calls_on_two_workers_and_a_worker_death(
        front: Served, caplog: pytest.LogCaptureFixture) -> None:
    first, second = await connect(front.url), await connect(front.url)
    try:
        on_first = workers(front).worker_of(call_id(first))
        on_second = workers(front).worker_of(call_id(second))
        assert on_first is not None and on_second is not None
        assert on_first is not on_second  # least loaded first: one call each
        async with httpx.AsyncClient(base_url=front.url) as http:
            ready = (await http.get("/readyz")).json()
        assert ready["calls"] == 2
        assert sorted(w["calls"] for w in ready["call_workers"]) == [1, 1]
        async with httpx.AsyncClient(base_url=front.url) as http:
            metrics = (await http.get("/metrics")).text
        assert 'omnivox_active_calls{call_worker="0"} 1.0' in metrics
        assert 'omnivox_active_calls{call_worker="1"} 1.0' in metrics

        await answered(first, "Hello there.", 1)
        await answered(second, "Good morning.", 1)

        # A stage given up for good (the pipeline's listener, called as the supervisor would):
        # the calls on both workers hear it.
        workers(front).announce("talker", "a test says so")
        for caller in (first, second):
            error = await caller.wait_for("error", timeout=30)
            assert error["error"]["code"] == "stage_failed"

        # The sideband of the second call reaches its worker: it sees that call's session
        # and steers it (a message it adds is answered on the call).
        sideband_url = front.url.replace("http", "ws") + f"/v1/realtime?call_id={call_id(second)}"
        async with ws_connect(sideband_url) as sideband:
            created = json.loads(await sideband.recv())
            assert created["type"] == "session.created"
            await sideband.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "And now?"}]}}))
            await sideband.send(json.dumps({"type": "response.create"}))
            await second.wait_for("response.done", timeout=120, count=2)

        # SIGKILL the second call's worker: only that call ends, and says why.
        assert on_second.process is not None
        dead_pid = on_second.process.pid
        os.kill(dead_pid, signal.SIGKILL)
        await wait_until(lambda: on_second.restarts == 1 and on_second.up, 120,
                         "the dead worker started again")
        assert on_second.process.pid != dead_pid
        assert f"call worker {on_second.index} (pid {dead_pid}) died" in caplog.text
        assert (await record(front, call_id(second)))["end_reason"] == DIED
        assert (await record(front, call_id(first)))["end_reason"] is None

        await answered(first, "Are you still there?", 2)  # the other call goes on
        third = await connect(front.url)  # and the restarted worker takes calls
        try:
            assert workers(front).worker_of(call_id(third)) is on_second
        finally:
            await third.hang_up()  # DELETE through the front, to the restarted worker
        await wait_until(lambda: not on_second.calls, 30, "the third call gone")
        assert (await record(front, call_id(third)))["end_reason"] == "hangup"

        # Resuming the first call: offered first to the idle worker, which never held it
        # (410), then to the first call's worker, which hands its conversation over.
        token = first.of_type("session.created")[0]["resume"]["token"]
        back = RtcCaller(front.url, ArrayAudioTrack(np.zeros(0, np.int16)))
        await back.connect(headers={RESUME_HEADER: token})
        try:
            await back.wait_for("session.created")
            assert workers(front).worker_of(call_id(back)) is on_first
            await answered(back, "Where were we?", 1)
        finally:
            await back.hang_up()
        async with httpx.AsyncClient(base_url=front.url) as http:
            gone = await http.delete(f"/v1/realtime/calls/{call_id(second)}")
            assert gone.status_code == 404  # its worker died: no such call any more
        await wait_until(lambda: workers(front).live() == 0, 30, "no call left")
    finally:
        await first.close()
        await second.close()


async def asked(conn: AsyncRealtimeConnection, question: np.ndarray) -> list[Any]:
    """One turn: the question's audio appended and committed, the reply's events (to done)."""
    seen: list[Any] = []
    await conn.session.update(session=MANUAL)
    await until(conn, "session.updated", seen)
    await append(conn, question)
    await conn.input_audio_buffer.commit()
    await conn.response.create()
    done = await until(conn, "response.done", seen)
    assert done.response.status == "completed", done
    return seen


async def refused_when_every_worker_is_full(front: Served) -> None:
    """More WebSocket calls until every worker refuses (`max_calls` 4 each): the handshake is
    refused 503 `server_busy` with Retry-After and OpenAI's error body, as an offer would be."""
    url = front.url.replace("http", "ws") + "/v1/realtime?model=omnivox-tiny"
    async with contextlib.AsyncExitStack() as more:
        with pytest.raises(websockets.InvalidStatus) as denied:
            for _ in range(2 * 4):
                socket = await more.enter_async_context(ws_connect(url))
                assert json.loads(await socket.recv())["type"] == "session.created"
        assert workers(front).live() <= 2 * 4 and len(front.app.state.calls) == 0
    refusal = denied.value.response
    assert refusal.status_code == 503 and refusal.headers["retry-after"]
    assert json.loads(refusal.body or b"")["error"]["code"] == "server_busy"


@pytest.mark.engines
async def test_realtime_websocket_calls_on_two_workers(front: Served, tmp_path: Path) -> None:
    question = resample(spoken("What is the weather like?", tmp_path), 48_000, RATE)
    client = openai.AsyncOpenAI(base_url=f"{front.url}/v1", api_key="local-mode")
    async with (client.realtime.connect(model="omnivox-tiny") as first,
                client.realtime.connect(model="omnivox-tiny") as second):
        created: list[Any] = [await conn.recv() for conn in (first, second)]
        ids = [event.session.id for event in created]
        on = [workers(front).worker_of(i) for i in ids]
        assert on[0] is not None and on[1] is not None
        assert on[0] is not on[1]  # least loaded first: one call each
        assert len(front.app.state.calls) == 0  # the front relays; it holds no call
        async with httpx.AsyncClient(base_url=front.url) as http:
            ready = (await http.get("/readyz")).json()
        assert ready["calls"] == 2
        assert sorted(w["calls"] for w in ready["call_workers"]) == [1, 1]

        for seen in await asyncio.gather(asked(first, question), asked(second, question)):
            audio = audio_of(seen, seen[-1].response.id)  # the reply's, to its response.done
            assert len(audio) > RATE // 4 and np.abs(audio).max() > LOUD, len(audio)
            assert any(e.type == "response.output_audio_transcript.delta" for e in seen)

        await refused_when_every_worker_is_full(front)

        # The second call's worker dies: its client sees the close, its record says why.
        dying = on[1]
        assert dying is not None and dying.process is not None
        os.kill(dying.process.pid, signal.SIGKILL)
        with pytest.raises(websockets.ConnectionClosedError) as closed:
            await until(second, "never", [])
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
        await wait_until(lambda: dying.restarts == 1 and dying.up, 120, "the worker restarted")
        assert (await record(front, ids[1]))["end_reason"] == DIED
    await wait_until(lambda: workers(front).live() == 0, 30, "no call left")
    assert (await record(front, ids[0]))["end_reason"] == "hangup"


def test_scaling_counts_the_calls_carried_on_time() -> None:
    def level(calls: int, late_ms: float | None, dropped: int = 0) -> dict[str, Any]:
        return {"concurrency": calls, "calls_connected": calls, "calls_dropped": dropped,
                "turns_ok": calls, "capacity": {"pacing_late_p99_ms": late_ms}}

    figures = scaling({1: [level(4, 12.0), level(8, 35.0)],
                       2: [level(4, 8.0), level(8, 15.0), level(16, 60.0, dropped=1)]})
    one, two = figures["servers"]
    assert one["carried"]["20"] == 4 and two["carried"]["20"] == 8
    assert two["ratio"]["20"] == 2.0
    assert one["carried"]["50"] == 8 and two["carried"]["200"] == 8  # a drop carries nothing
    assert "call workers" in scaling_table({"scaling": figures})
