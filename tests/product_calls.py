"""Calls to the real product in tests: a caller connects over real WebRTC, the test reaches the
call's server-side session, checks every server event against OpenAI's models and judges what
the caller heard."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from agent.realtime.session import Session
from pipeline.turns.events import Turn
from tests.audio_fixtures import read_wav, speech_wav
from tests.rtc_client import ArrayAudioTrack, RtcCaller
from tests.served import Served

SERVER_EVENT = TypeAdapter(RealtimeServerEvent)
LOUD = 300  # int16 amplitude above which received audio counts as agent speech


def spoken(text: str, folder: Path, pad_before_s: float = 0.5, pad_after_s: float = 0.2
           ) -> np.ndarray:
    """`text` spoken by espeak-ng as 48 kHz mono int16, with silence around it."""
    path = speech_wav(text, folder / "speech.wav", pad_before_s=pad_before_s,
                      pad_after_s=pad_after_s)
    return read_wav(path)[0]


async def connect(url: str, pcm: np.ndarray | None = None) -> RtcCaller:
    """A connected caller that plays `pcm` (or silence) and has its session.created."""
    track = ArrayAudioTrack(pcm if pcm is not None else np.zeros(0, np.int16))
    caller = RtcCaller(url, track)
    await caller.connect()
    await caller.wait_for("session.created")
    return caller


async def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `condition()` on the test's event loop (which also runs the server)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)


def call_id_of(caller: RtcCaller) -> str:
    return caller.call_id


async def get_record(base_url: str, call_id: str) -> httpx.Response:
    """`GET /v1/calls/{call_id}`: the call's record."""
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        return await http.get(f"/v1/calls/{call_id}")


def session_of(served: Served, caller: RtcCaller) -> Session:
    """The server's conversation session of this caller's call."""
    session = served.app.state.calls.get(call_id_of(caller)).handler
    assert isinstance(session, Session), f"the call's handler is a {type(session).__name__}"
    return session


def update_session(caller: RtcCaller, **session: Any) -> None:
    caller.send({"type": "session.update", "session": {"type": "realtime", **session}})


def turn_detection(**fields: Any) -> dict[str, Any]:
    """The `audio` part of a session.update that changes server VAD settings."""
    return {"input": {"turn_detection": {"type": "server_vad", **fields}}}


def long_replies(caller: RtcCaller) -> None:
    """Replies as long as the Thinker's context allows: on the tiny family about 900 tokens, over
    a minute of audio, more than the call's outbound queue holds (30 s). The session's reply is
    then still generating, held back by playback, until half a minute of it has played: a
    consequence of the bounded queue, not of how fast this machine is."""
    update_session(caller, max_output_tokens="inf")


def type_text(caller: RtcCaller, text: str) -> None:
    """The caller adds a typed user message to the conversation (it starts no reply)."""
    caller.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})


def say(caller: RtcCaller, text: str) -> None:
    """The caller types a user message and asks for the reply, as OpenAI's clients do."""
    type_text(caller, text)
    caller.send({"type": "response.create"})


def types(caller: RtcCaller) -> list[str]:
    return [e["type"] for _, e in caller.events]


def assert_valid_events(caller: RtcCaller) -> None:
    """Every server event the caller got is one OpenAI's SDK models accept."""
    for _, event in caller.events:
        SERVER_EVENT.validate_python(event)


def transcript_of(caller: RtcCaller, response_id: str) -> str:
    """The agent text the caller was sent for one response (its transcript deltas)."""
    return "".join(e["delta"] for e in caller.of_type("response.output_audio_transcript.delta")
                   if e["response_id"] == response_id)


def loud_ms(caller: RtcCaller) -> int:
    """Milliseconds of loud audio the caller received, counted on the stream's own (RTP) clock:
    silences (underruns included) do not count, and neither does arrival jitter."""
    return sum(caller.loud_bursts(LOUD))


def loud_after(caller: RtcCaller, t0: float) -> int:
    """Loud received samples that arrived after monotonic time t0."""
    frames = [f for f, at in zip(caller.received, caller.received_at, strict=True) if at > t0]
    return int(sum(np.count_nonzero(np.abs(f) > LOUD) for f in frames))


async def held_request_ids(served: Served) -> list[str]:
    """Every request id the stages' engines and workers still hold (asked of the workers)."""
    held = await served.app.state.pipeline.active_requests()
    return [r for reply in held.values() for r in reply.engine_ids + reply.serving_ids]


async def engines_hold(served: Served, turn_id: str) -> list[str]:
    return [r for r in await held_request_ids(served) if turn_id in r]


async def barge_in_on_a_second_reply(served: Served, caller: RtcCaller, question: np.ndarray,
                                     timeout_s: float) -> None:
    """The caller asks `question` again, then talks over the reply while it is still being
    generated: the reply is cancelled and every request of its turn leaves every engine and
    worker."""
    # Long enough to be still generating when talked over: 200 tokens (about 1 s here) ended
    # only 0.15 s after the cut lands here, and before it on CI's machine; 600 give a 3x margin.
    update_session(caller, max_output_tokens=600)
    await caller.wait_for("session.updated", timeout=10)
    caller.audio.replace(question)  # the caller asks again: a second reply starts
    await caller.wait_for("output_audio_buffer.started", count=2, timeout=timeout_s)
    reply = session_of(served, caller).reply
    assert reply is not None
    caller.audio.replace(question)  # ... and is talked over mid-generation
    cut = await caller.wait_for("response.done", count=2, timeout=timeout_s)
    assert cut["response"]["status"] == "cancelled", cut
    for _ in range(300):
        if not await engines_hold(served, reply.turn_id):
            break
        await asyncio.sleep(0.1)
    assert await engines_hold(served, reply.turn_id) == []


class RecordingPipeline:
    """The session's real pipeline, noting each Turn it is asked to run: what the Thinker is
    given (history, audio, limits) as the session built it."""

    def __init__(self, pipeline: Any) -> None:
        self._pipeline = pipeline
        self.turns: list[Turn] = []

    def respond(self, turn: Turn, **options: Any) -> Any:
        self.turns.append(turn)
        return self._pipeline.respond(turn, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipeline, name)


def record_turns(session: Session) -> list[Turn]:
    """Start noting the Turns of this one session; the returned list fills as replies start."""
    recorder = RecordingPipeline(session.pipeline)
    session.pipeline = recorder
    return recorder.turns
