"""server_vad's `idle_timeout_ms` on the tiny family's real engines: once the agent's reply has
played out and the caller stays silent that long, `input_audio_buffer.timeout_triggered` says
so and a reply follows; the caller speaking, or a semantic_vad session, keeps it from firing."""

from __future__ import annotations

import pytest

from tests.product_calls import (
    assert_valid_events,
    say,
    session_of,
    turn_detection,
    update_session,
)
from tests.rtc_client import RtcCaller
from tests.served import Served

pytestmark = [pytest.mark.engines]

IDLE_MS = 1500


def at(caller: RtcCaller, event_type: str, count: int = 1) -> float:
    """When the caller received its `count`-th event of `event_type`."""
    return [ts for ts, e in caller.events if e["type"] == event_type][count - 1]


async def test_silence_after_the_reply_triggers_an_answer(
    tiny_server: Served, caller: RtcCaller
) -> None:
    session = session_of(tiny_server, caller)
    update_session(caller, max_output_tokens=8, audio=turn_detection(idle_timeout_ms=IDLE_MS))
    updated = (await caller.wait_for("session.updated"))["session"]
    assert updated["audio"]["input"]["turn_detection"]["idle_timeout_ms"] == IDLE_MS
    say(caller, "Hello?")
    await caller.wait_for("output_audio_buffer.stopped", timeout=60)
    timeout = await caller.wait_for("input_audio_buffer.timeout_triggered", timeout=30)
    waited = at(caller, "input_audio_buffer.timeout_triggered") - at(
        caller, "output_audio_buffer.stopped")
    assert waited >= IDLE_MS / 1000 - 0.05, waited  # never before the silence was that long
    assert timeout["audio_end_ms"] - timeout["audio_start_ms"] == IDLE_MS
    created = await caller.wait_for("response.created", count=2, timeout=10)
    assert at(caller, "response.created", 2) > at(caller, "input_audio_buffer.timeout_triggered")
    added = [e["item"] for e in caller.of_type("conversation.item.added")]
    assert timeout["item_id"] in [i["id"] for i in added if i["role"] == "user"]
    done = await caller.wait_for("response.done", count=2, timeout=60)
    assert done["response"]["id"] == created["response"]["id"]
    assert done["response"]["status"] == "completed", done

    # Turned off (null): the next reply's silence triggers nothing more.
    update_session(caller, audio=turn_detection(idle_timeout_ms=None))
    await caller.wait_for("session.updated", count=2)
    await caller.wait_for("output_audio_buffer.stopped", count=2, timeout=60)
    assert not session.idle.armed
    assert len(caller.of_type("input_audio_buffer.timeout_triggered")) == 1
    assert_valid_events(caller)


async def test_an_idle_timeout_is_server_vad_s_and_at_least_a_second(
    tiny_server: Served, caller: RtcCaller
) -> None:
    update_session(caller, audio=turn_detection(idle_timeout_ms=200))
    error = (await caller.wait_for("error"))["error"]
    assert "idle_timeout_ms must be at least 1000" in error["message"], error
    update_session(caller, audio=turn_detection(idle_timeout_ms=IDLE_MS))
    await caller.wait_for("session.updated")
    caller.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "semantic_vad"}}}}})
    semantic = (await caller.wait_for("session.updated", count=2))["session"]
    assert "idle_timeout_ms" not in semantic["audio"]["input"]["turn_detection"]
    assert session_of(tiny_server, caller).settings.idle_timeout_ms is None
