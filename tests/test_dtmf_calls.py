"""DTMF on a real call to the shared tiny server: an aiortc caller whose offer carries
telephone-event (beside Opus, as a browser's does) presses keys as raw RFC 4733 RTP while it
asks a question. Each key arrives once, in order, as `input_audio_buffer.dtmf_event_received`
on the call's data channel and on a sideband WebSocket, and the question is one turn as
without them (the packets never reach the decoder, and so never the VAD)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import connect

from media.aiortc_internals import accept_telephone_events
from media.peer import dtmf_sender
from tests.product_calls import LOUD, SERVER_EVENT, spoken, wait_until
from tests.rtc_client import ArrayAudioTrack, RtcCaller
from tests.served import Served

pytestmark = pytest.mark.engines

DTMF = "dtmf_event_received"
KEYS = "19#*A0"


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return spoken("What is the weather like today?", Path(tmp_path_factory.mktemp("speech")))


@contextlib.asynccontextmanager
async def sideband(served: Served, call_id: str) -> AsyncIterator[list[dict[str, Any]]]:
    """The call's server events as a sideband WebSocket receives them, for the block."""
    url = served.url.replace("http://", "ws://") + f"/v1/realtime?call_id={call_id}"
    events: list[dict[str, Any]] = []
    async with connect(url) as socket:

        async def read() -> None:
            async for message in socket:
                events.append(json.loads(message))

        reader = asyncio.ensure_future(read())
        await wait_until(lambda: bool(events), 20, "the sideband's session.created")
        try:
            yield events
        finally:
            reader.cancel()


def keys(events: list[dict[str, Any]]) -> str:
    return "".join(e["event"] for e in events if e["type"].endswith(DTMF))


async def test_keys_pressed_arrive_on_the_data_channel_and_the_sideband(
    tiny_server: Served, question: np.ndarray
) -> None:
    accept_telephone_events()  # aiortc offers telephone-event only once told to
    # Every codec aiortc has, Opus first: telephone-event at 8 and 48 kHz among them, as a
    # browser offers (aiortc's codec preferences cannot tell the two rates apart).
    caller = RtcCaller(tiny_server.url, ArrayAudioTrack(question))
    await caller.connect()
    try:
        await caller.wait_for("session.created")
        call_id = caller.location.rsplit("/", 1)[1]
        async with sideband(tiny_server, call_id) as observed:
            sender = dtmf_sender(caller.pc, 48_000)  # a browser's RTCDTMFSender's rate
            assert sender is not None, caller.pc.remoteDescription.sdp
            before = int(time.time())
            for key in KEYS:  # pressed while the question is being spoken
                sender.press(key, 80)
            await asyncio.wait_for(sender.drained(), 20)
            await wait_until(lambda: len(keys(observed)) >= len(KEYS), 20, "the sideband's keys")
            await wait_until(lambda: len(caller.of_type(f"input_audio_buffer.{DTMF}"))
                             >= len(KEYS), 20, "the data channel's keys")
            after = int(time.time())
            await caller.wait_for("response.created", timeout=60)
            await wait_until(lambda: any(np.abs(f).max() > LOUD for f in caller.received), 60,
                             "the agent's answer")
        await sender.close()
    finally:
        await caller.hang_up()
    on_call = caller.of_type(f"input_audio_buffer.{DTMF}")
    assert keys(observed) == KEYS and "".join(e["event"] for e in on_call) == KEYS
    for event in on_call:
        SERVER_EVENT.validate_python(event)  # the shape OpenAI's SDK reads
        assert before <= event["received_at"] <= after
    assert [e["event_id"] for e in on_call] == [e["event_id"] for e in observed
                                                if e["type"].endswith(DTMF)]
    # One question, one turn: the key presses were no speech and split nothing.
    assert len(caller.of_type("input_audio_buffer.speech_started")) == 1
    assert len(caller.of_type("input_audio_buffer.speech_stopped")) == 1
