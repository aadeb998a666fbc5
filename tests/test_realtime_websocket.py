"""Who may open a Realtime WebSocket, and the bounds of one (no engines: a server without a
pipeline takes the connection; the conversation itself is tested in
test_openai_sdk_realtime.py): an API key or a client secret as a bearer token, a client secret
(never a key) in the browser's `openai-insecure-api-key.` subprotocol, once; a call's sideband
with a key only; a client sending audio faster than real time gets an `error` event and is
disconnected."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import websockets
from websockets.asyncio.client import connect

from agent.app import create_app
from agent.config import Settings
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
