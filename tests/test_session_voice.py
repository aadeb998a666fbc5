"""A voice the model does not speak is refused where a session names it, instead of failing the
next reply: at session.update (an `error` naming session.audio.output.voice, nothing of that
update applied; one of its voices is taken), and at the call's start (the offer's session, or
the server's own voice on a WebSocket: a 400 naming the voice and the model's voices, no call
left behind). On the shared tiny server's pipeline (voices: default, bright), no turn needed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import websockets
from aiortc import RTCPeerConnection
from websockets.asyncio.client import connect as ws_connect

from agent.app import create_app
from agent.config import ConversationSettings, Settings
from tests.conftest import wait_idle
from tests.product_calls import session_of, update_session
from tests.rtc_client import RtcCaller
from tests.served import Served, serve

pytestmark = pytest.mark.engines
VOICE_PARAM = "session.audio.output.voice"


async def test_an_unknown_voice_is_refused_at_session_update(
    tiny_server: Served, caller: RtcCaller
) -> None:
    session = session_of(tiny_server, caller)
    caller.send({"type": "session.update", "event_id": "evt_voice", "session": {
        "type": "realtime", "instructions": "Not applied.",
        "audio": {"output": {"voice": "nobody"}}}})
    error = (await caller.wait_for("error"))["error"]
    assert (error["type"], error["code"], error["param"], error["event_id"]) == (
        "invalid_request_error", "invalid_value", VOICE_PARAM, "evt_voice"), error
    assert "'nobody'" in error["message"] and "bright" in error["message"], error
    assert not caller.of_type("session.updated")
    assert session.settings.voice == "default"
    assert session.settings.instructions != "Not applied."
    update_session(caller, audio={"output": {"voice": "bright"}})
    updated = (await caller.wait_for("session.updated"))["session"]
    assert updated["audio"]["output"]["voice"] == "bright"
    assert session.settings.voice == "bright"


async def offer_sdp() -> str:
    """An audio offer nobody will answer (the server refuses it before negotiating)."""
    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("audio", direction="sendrecv")
        await pc.setLocalDescription(await pc.createOffer())
        return pc.localDescription.sdp
    finally:
        await pc.close()


def assert_voice_refused(body: Any, voice: str) -> None:
    """OpenAI's error shape, naming the voice and the tiny model's voices."""
    assert isinstance(body, dict), body
    error = body.get("error", body)  # the SDK hands over the `error` object itself
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error", "invalid_session", VOICE_PARAM), error
    assert f"{voice!r}" in error["message"] and "default, bright" in error["message"], error


def held_calls(served: Served) -> tuple[int, int]:
    """The calls the server holds, and the bindings its versions count."""
    return len(served.app.state.calls), sum(v.calls for v in served.app.state.models.versions())


async def test_an_offer_whose_session_names_an_unknown_voice_is_a_400(
    tiny_server: Served,
) -> None:
    client = openai.AsyncOpenAI(base_url=f"{tiny_server.url}/v1", api_key="local-needs-none")
    with pytest.raises(openai.BadRequestError) as refused:
        await client.realtime.calls.create(sdp=await offer_sdp(), session={
            "type": "realtime", "audio": {"output": {"voice": "nobody"}}})
    assert refused.value.status_code == 400
    assert_voice_refused(refused.value.body, "nobody")
    assert held_calls(tiny_server) == (0, 0)  # no call registered, no version held


@pytest.fixture
async def voiceless_server(
    shared_tiny_server: Served, tmp_path: Path
) -> AsyncIterator[Served]:
    """The product configured with a voice the tiny model lacks, on the shared tiny pipeline
    (an API setting: the engines serve as they are)."""
    await wait_idle(shared_tiny_server)
    settings = Settings(profile="tiny", models_dir=shared_tiny_server.app.state.settings.models_dir,
                        data_dir=tmp_path, conversation=ConversationSettings(voice="nobody"))
    app = create_app(settings, pipeline=shared_tiny_server.app.state.pipeline,
                     owns_pipeline=False)
    async with serve(app) as served:
        yield served


async def test_a_websocket_starting_on_a_voice_its_model_lacks_is_refused(
    voiceless_server: Served,
) -> None:
    url = voiceless_server.url.replace("http://", "ws://") + "/v1/realtime?model=omnivox"
    with pytest.raises(websockets.InvalidStatus) as denied:
        async with ws_connect(url):
            pass
    response = denied.value.response
    assert response.status_code == 400
    assert_voice_refused(json.loads(response.body), "nobody")
    assert held_calls(voiceless_server) == (0, 0)
