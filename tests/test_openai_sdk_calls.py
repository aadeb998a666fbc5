"""The official `openai` SDK places, configures and hangs up WebRTC calls unchanged: both forms of
`client.realtime.calls.create` (the SDP alone, and the multipart form with the call's `session`,
applied from the first event) and `client.realtime.calls.hangup`. A media-only server answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from aiortc import RTCSessionDescription

from agent.config import Settings
from tests.media_servers import tone_server
from tests.product_calls import wait_until
from tests.rtc_client import ArrayAudioTrack, RtcCaller
from tests.served import Served

SESSION = {
    "type": "realtime",
    "instructions": "Answer like a ship's captain.",
    "max_output_tokens": 40,
    "audio": {
        "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 800,
                                     "create_response": False}},
        "output": {"voice": "alloy"},
    },
}


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with tone_server(Settings(data_dir=tmp_path)) as server:
        yield server


def sdk(served: Served) -> openai.AsyncOpenAI:
    # No API keys on the server (local mode); the SDK insists on one, and sends it.
    return openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key="local-mode-needs-none")


async def place(client: openai.AsyncOpenAI, url: str, **session: Any) -> RtcCaller:
    """An aiortc caller whose offer the SDK posts; connected to the answer it got."""
    caller = RtcCaller(url, ArrayAudioTrack(np.zeros(48_000, np.int16)))
    caller.pc.addTransceiver(caller.audio, direction="sendrecv")
    await caller.pc.setLocalDescription(await caller.pc.createOffer())
    answer = await client.realtime.calls.create(sdp=caller.pc.localDescription.sdp, **session)
    caller.location = answer.response.headers["location"]
    await caller.pc.setRemoteDescription(RTCSessionDescription(answer.text, "answer"))
    return caller


def call_id(caller: RtcCaller) -> str:
    assert caller.location is not None
    return caller.location.rsplit("/", 1)[1]


async def test_create_with_a_session_applies_it_from_the_first_event(served: Served) -> None:
    caller = await place(sdk(served), served.url, session=SESSION)
    try:
        created = (await caller.wait_for("session.created", timeout=30))["session"]
        detection = created["audio"]["input"]["turn_detection"]
        assert created["instructions"] == SESSION["instructions"]
        assert created["audio"]["output"]["voice"] == "alloy"
        assert created["max_output_tokens"] == 40
        assert detection["silence_duration_ms"] == 800 and detection["create_response"] is False
        call = served.app.state.calls.get(call_id(caller))
        assert call.vad.config.silence_ms == 800  # the VAD runs with it, not only the event
    finally:
        await caller.close()


async def test_create_with_the_sdp_alone_and_hang_up_through_the_sdk(served: Served) -> None:
    client = sdk(served)
    caller = await place(client, served.url)
    try:
        created = (await caller.wait_for("session.created", timeout=30))["session"]
        assert created["instructions"] == Settings().conversation.instructions
        ended = call_id(caller)
        await client.realtime.calls.hangup(ended)
        await wait_until(lambda: served.app.state.calls.get(ended) is None, 10,
                         "the hung-up call to end")
        row = await served.app.state.records.call_record(ended)
        assert row is not None and row["end_reason"] == "hangup"
    finally:
        await caller.close()


@pytest.mark.parametrize(("session", "named"), [
    ({"type": "realtime", "max_output_tokens": 0}, "max_output_tokens"),
    ({"type": "realtime", "audio": {"input": {"turn_detection": {"type": "bogus"}}}},
     "turn_detection"),
])
async def test_a_session_the_server_refuses_is_a_400_naming_it(
    served: Served, session: dict[str, Any], named: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await place(sdk(served), served.url, session=session)
    body = refused.value.body
    assert isinstance(body, dict) and body["code"] == "invalid_session", body
    assert named in body["message"]
    assert len(served.app.state.calls) == 0  # nothing left behind
