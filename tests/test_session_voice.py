"""A session.update naming a voice the model does not speak is refused then and there (an
`error` naming session.audio.output.voice, nothing of that update applied) instead of failing
the next reply; one of its voices is taken. On the shared tiny server (voices: default, bright),
no turn needed."""

from __future__ import annotations

import pytest

from tests.product_calls import session_of, update_session
from tests.rtc_client import RtcCaller
from tests.served import Served

pytestmark = pytest.mark.engines


async def test_an_unknown_voice_is_refused_at_session_update(
    tiny_server: Served, caller: RtcCaller
) -> None:
    session = session_of(tiny_server, caller)
    caller.send({"type": "session.update", "event_id": "evt_voice", "session": {
        "type": "realtime", "instructions": "Not applied.",
        "audio": {"output": {"voice": "nobody"}}}})
    error = (await caller.wait_for("error"))["error"]
    assert (error["type"], error["code"], error["param"], error["event_id"]) == (
        "invalid_request_error", "invalid_value", "session.audio.output.voice", "evt_voice"), error
    assert "'nobody'" in error["message"] and "bright" in error["message"], error
    assert not caller.of_type("session.updated")
    assert session.settings.voice == "default"
    assert session.settings.instructions != "Not applied."
    update_session(caller, audio={"output": {"voice": "bright"}})
    updated = (await caller.wait_for("session.updated"))["session"]
    assert updated["audio"]["output"]["voice"] == "bright"
    assert session.settings.voice == "bright"
