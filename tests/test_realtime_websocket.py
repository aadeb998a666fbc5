"""Who may open a Realtime WebSocket, and the bounds of one (no engines: a server without a
pipeline takes the connection; the conversation itself is tested in
test_openai_sdk_realtime.py): an API key or a client secret as a bearer token, a client secret
(never a key) in the browser's `openai-insecure-api-key.` subprotocol, once; a call's sideband
with a key only; a client sending audio faster than real time, or one that stops reading while
the agent talks, gets an `error` event and is disconnected."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import websockets
from websockets.asyncio.client import connect

from agent.app import create_app
from agent.calls.websocket_call import WebSocketCall
from agent.config import Settings
from tests.product_calls import wait_until
from tests.served import Served, serve

KEY = "test-key-0123456789abcdef"
AHEAD_MS = 1_000


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    settings = Settings(data_dir=tmp_path, api_keys=[KEY], ws_audio_ahead_ms=AHEAD_MS)
    async with serve(create_app(settings)) as server:
        yield server


def ws_url(served: Served, query: str = "model=omnivox") -> str:
    return served.url.replace("http://", "ws://") + f"/v1/realtime?{query}"


async def secret(served: Served) -> str:
    client = openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key=KEY)
    return (await client.realtime.client_secrets.create()).value


async def first_event(served: Served, api_key: str) -> Any:
    client = openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key=api_key)
    async with client.realtime.connect(model="omnivox") as conn:
        return await conn.recv()


async def test_a_key_or_a_client_secret_connects_and_nothing_else_does(served: Served) -> None:
    assert (await first_event(served, KEY)).type == "session.created"
    one_use = await secret(served)
    assert (await first_event(served, one_use)).type == "session.created"
    for refused in ("not-a-key-0123456789abcdef", one_use):  # a wrong key; a used secret
        with pytest.raises(websockets.InvalidStatus) as denied:
            await first_event(served, refused)
        assert denied.value.response.status_code == 403
    with pytest.raises(websockets.InvalidStatus) as denied:  # no credential at all
        async with connect(ws_url(served)):
            pass
    assert denied.value.response.status_code == 403
    assert len(served.app.state.calls) == 0


async def test_a_browser_gives_a_client_secret_as_a_subprotocol_never_a_key(
    served: Served,
) -> None:
    protocols: Any = ["realtime", f"openai-insecure-api-key.{await secret(served)}"]
    async with connect(ws_url(served), subprotocols=protocols) as browser:
        assert browser.subprotocol == "realtime"
        assert '"session.created"' in await browser.recv()
    with pytest.raises(websockets.InvalidStatus):
        async with connect(ws_url(served), subprotocols=[
                "realtime", f"openai-insecure-api-key.{KEY}"]):  # type: ignore[list-item]
            pass


async def test_joining_a_call_needs_a_key_and_a_live_call(served: Served) -> None:
    with pytest.raises(websockets.InvalidStatus) as denied:
        async with connect(ws_url(served, "call_id=rtc_1"),
                           additional_headers={"Authorization": f"Bearer {KEY}"}):
            pass
    assert denied.value.response.status_code == 404  # no such call
    for query in ("call_id=rtc_1", "call%5Fid=rtc_1"):  # a secret may not even ask
        with pytest.raises(websockets.InvalidStatus) as denied:
            async with connect(ws_url(served, query), additional_headers={
                    "Authorization": f"Bearer {await secret(served)}"}):
                pass
        assert denied.value.response.status_code == 403


async def test_a_client_sending_audio_faster_than_real_time_is_disconnected(
    served: Served,
) -> None:
    client = openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key=KEY)
    silence = base64.b64encode(np.zeros(2_400, "<i2").tobytes()).decode()  # 100 ms
    events: list[Any] = []
    async with client.realtime.connect(model="omnivox") as conn:
        events.append(await conn.recv())
        with pytest.raises(websockets.ConnectionClosed):
            for _ in range(5 * AHEAD_MS // 100):  # five times the allowance, at once
                await conn.input_audio_buffer.append(audio=silence)
            async for event in conn:
                events.append(event)
            await conn.recv()
    errors = [e for e in events if e.type == "error"]
    assert [e.error.code for e in errors] == ["input_audio_too_fast"], events
    assert len(served.app.state.calls) == 0
    row = await served.app.state.records.call_record(events[0].session.id)
    assert row is not None and row["end_reason"] == "input_audio_too_fast"


SEND_BUFFER = 64 * 1024  # the smallest ws_send_buffer_bytes
REPLY_S = 60  # the stand-in's reply: 3.8 MB of audio deltas


class LongReply:
    """A stand-in for the conversation (no engines): every `response.create` is answered with
    REPLY_S of noise (a tone's deltas would shrink to little under permessage-deflate), played
    as the session plays a reply (`call.play`: all of it due at once, outbound_queue_ms
    allowing)."""

    def __init__(self, call: WebSocketCall) -> None:
        self.call = call

    def on_client_event(self, event: Any) -> None:
        if event.type == "response.create":
            noise = np.random.default_rng(7).integers(-3000, 3000, REPLY_S * 24_000, np.int16)
            self.call.spawn(self.call.play(f"resp_{id(event)}", "item_1", noise, 24_000))

    def on_speech_started(self, *_: Any) -> None: ...
    def on_speech_heard(self, *_: Any) -> None: ...
    def on_speech_stopped(self, *_: Any) -> None: ...
    def on_speech_paused(self, *_: Any) -> None: ...
    def on_speech_resumed(self, *_: Any) -> None: ...
    async def aclose(self) -> None: ...


@pytest.fixture
async def talkative(tmp_path: Path) -> AsyncIterator[Served]:
    settings = Settings(data_dir=tmp_path, api_keys=[KEY], ws_send_buffer_bytes=SEND_BUFFER,
                        outbound_queue_ms=2 * REPLY_S * 1000)
    async with serve(create_app(settings, handler_factory=LongReply),
                     send_buffer=16 * 1024) as server:
        yield server


def small_buffer_socket(served: Served) -> socket.socket:
    """A TCP connection to the server that holds little unread (4 KiB asked of the kernel)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", int(served.url.rsplit(":", 1)[1])))
    sock.setblocking(False)
    return sock


async def test_a_client_that_never_reads_is_disconnected_and_others_go_on(
    talkative: Served,
) -> None:
    """A client asks for a reply and never reads: the events waiting for it stay within
    ws_send_buffer_bytes, then it is disconnected (`client_not_reading` in its record), having
    been sent a small part of the reply; a client reading beside it hears its reply on."""
    calls = talkative.app.state.calls
    auth = {"Authorization": f"Bearer {KEY}"}
    async with (connect(ws_url(talkative), additional_headers=auth) as reader,
                connect(ws_url(talkative), additional_headers=auth, max_queue=1,
                        sock=small_buffer_socket(talkative)) as stuck):
        await wait_until(lambda: len(calls) == 2, 10, "both calls")
        reader_call, stuck_call = sorted(calls, key=lambda call: call.started_at)
        await stuck.send(json.dumps({"type": "response.create"}))
        await reader.send(json.dumps({"type": "response.create"}))
        most_waiting = 0
        while stuck_call in calls:  # the reader reads, the stuck client never does
            most_waiting = max(most_waiting, stuck_call.events_waiting_bytes)
            await asyncio.wait_for(reader.recv(), 10)
        assert reader_call in calls
        deltas = 0
        while deltas < 3:  # the reader's reply goes on
            event = json.loads(await asyncio.wait_for(reader.recv(), 10))
            deltas += event["type"] == "response.output_audio.delta"
        got = 0  # what reached the stuck client before it was cut off (the error may not:
        with contextlib.suppress(websockets.ConnectionClosed):  # it was not reading)
            async for message in stuck:
                got += len(message)
    reply = REPLY_S * 24_000 * 2 * 4 // 3
    print(f"\n[ws-bounds] most events waiting {most_waiting} B; the stuck client got {got} B "
          f"of a {reply} B reply")
    assert most_waiting <= SEND_BUFFER
    assert got < reply // 4
    row = await talkative.app.state.records.call_record(stuck_call.id)
    assert row is not None and row["end_reason"] == "client_not_reading"
