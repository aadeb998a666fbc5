"""What the agent-framework tests (tests/test_agent_frameworks_*.py) share: a spoken question as
the frameworks send audio (pcm16, 24 kHz), the weather tool's schema, the server's WebSocket URL,
and the server-side view of the call a framework opened: the Turns its session asks the
pipeline for (what the Thinker is given) and every server event the call was sent.

The frameworks run unchanged, with their own defaults; only the URL and the API key are theirs
to be told. Their events are judged from their own public surface (events, frames, streams);
the server-side view says what the server did with what they sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.bench.speech import resample
from agent.calls.call_base import CallBase
from agent.realtime.session import Session
from pipeline.turns.events import Turn
from tests.product_calls import LOUD, record_turns, spoken
from tests.served import Served

RATE = 24_000  # the Realtime API's pcm16, what every framework sends and receives
API_KEY = "sk-omnivox-local"  # the tiny server runs in local mode: any key goes
WEATHER_CITIES = ("Paris", "Oslo", "Lima")
WEATHER_UNITS = ("C", "F")
TOOL_OUTPUT = {"temperature": 21, "sky": "clear"}


def ws_url(served: Served) -> str:
    """The server's base URL as a WebSocket client gives it (`ws://host:port`)."""
    return served.url.replace("http://", "ws://", 1)


def spoken_24k(text: str, folder: Path, pad_after_s: float = 2.0) -> np.ndarray:
    """`text` spoken by espeak-ng, 24 kHz mono int16, with silence after it long enough for
    any of the frameworks' default turn detections (semantic_vad "medium": 1.2 s) to close the
    turn on the audio alone (a WebSocket client sends no audio it does not have)."""
    return resample(spoken(text, folder, pad_after_s=pad_after_s), 48_000, RATE)


def chunks(pcm: np.ndarray, ms: int = 100) -> list[bytes]:
    """`pcm` as a microphone delivers it: pcm16 little-endian pieces of `ms` each."""
    step = RATE * ms // 1000
    return [pcm[i:i + step].astype("<i2").tobytes() for i in range(0, len(pcm), step)]


async def stream(pcm: np.ndarray, send: Callable[[bytes], Awaitable[None] | None],
                 ms: int = 20) -> None:
    """Send `pcm` as a microphone or a phone line delivers it: `ms` pieces in real time (on the
    loop's clock, late pieces catching up)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for n, piece in enumerate(chunks(pcm, ms)):
        await asyncio.sleep(max(0.0, start + n * ms / 1000 - loop.time()))
        sent = send(piece)
        if sent is not None:
            await sent


def loud(pcm: bytes | np.ndarray) -> bool:
    """Whether received agent audio holds speech-loud samples (not silence)."""
    samples = np.frombuffer(pcm, dtype="<i2") if isinstance(pcm, bytes) else pcm
    return bool(samples.size) and int(np.abs(samples.astype(np.int32)).max()) > LOUD


class EventLog:
    """Every server event a call sends, as its caller gets it: an observer of the call, the
    same hook the sideband uses (agent/calls/sideband.py)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def send(self, text: str) -> bool:
        self.events.append(json.loads(text))
        return True

    async def close(self, code: int) -> None:
        return None

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == event_type]

    def errors(self) -> list[dict[str, Any]]:
        return [e["error"] for e in self.of_type("error")]

    def types(self) -> list[str]:
        return [e["type"] for e in self.events if not e["type"].endswith(".delta")]

    def responses_done(self) -> list[dict[str, Any]]:
        return [e["response"] for e in self.of_type("response.done")]


@dataclass
class ServerCall:
    """The server's side of a framework's call: the call, its session's Turns from the moment
    it was found, and its server events from then on."""

    call: CallBase
    turns: list[Turn]
    log: EventLog = field(default_factory=EventLog)

    def replies(self) -> list[Turn]:
        """The Turns that answer (not the transcriptions of the caller's audio)."""
        return [t for t in self.turns if not t.transcribe]


def call_ids(served: Served) -> set[str]:
    return {call.id for call in served.app.state.calls}


async def new_call(served: Served, before: set[str], timeout_s: float = 15.0) -> ServerCall:
    """The one call that opened on `served` since `before` (its ids then), once its session
    exists: noted from now on (its Turns, its events)."""
    found: list[CallBase] = []

    def opened() -> bool:
        found[:] = [c for c in served.app.state.calls
                    if c.id not in before and c.handler is not None]
        return bool(found)

    await wait_for(opened, timeout_s, lambda: f"the framework's call to open on the server "
                   f"(calls now: {sorted(call_ids(served))})")
    assert len(found) == 1, f"more than one new call: {[c.id for c in found]}"
    call = found[0]
    handler = call.handler
    assert isinstance(handler, Session), f"the call's handler is a {type(handler).__name__}"
    server_call = ServerCall(call, record_turns(handler))
    call.observers.add(server_call.log)
    return server_call


async def wait_for(condition: Callable[[], bool], timeout_s: float,
                   what: Callable[[], str]) -> None:
    """Poll `condition()` until it holds; AssertionError naming `what()` (evaluated then, so
    it can say what was seen) after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what()}")
        await asyncio.sleep(0.02)


def tool_message_in(turn: Turn, output: str) -> bool:
    """Whether the Thinker's prompt for `turn` holds the function's output as a tool message."""
    return {"role": "tool", "content": output} in turn.messages
