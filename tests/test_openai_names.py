"""OpenAI's own names, as agent frameworks send them by default, on the tiny family's real
engines: the Realtime model, voice and transcription model names resolve through the alias table
(agent/realtime/aliases.py), what they resolved to is told back, and a refused update applies
nothing and says what it held."""

from __future__ import annotations

from typing import Any

import pytest

from agent.config import AliasSettings
from agent.profiles import profile_aliases
from tests.product_calls import (
    assert_valid_events,
    call_id_of,
    get_record,
    session_of,
)
from tests.rtc_client import RtcCaller
from tests.served import Served

# asyncio_mode auto, on the session's loop (pyproject.toml): the shared server's.
engines = pytest.mark.engines

# The session.update the OpenAI Agents SDK (openai-agents 0.24) sends first, from its
# DEFAULT_MODEL_SETTINGS and DEFAULT_REALTIME_MODEL, with an agent's instructions.
PCM = {"type": "audio/pcm", "rate": 24000}
AGENTS_SDK_UPDATE: dict[str, Any] = {
    "type": "realtime", "model": "gpt-realtime-2.1", "output_modalities": ["audio"],
    "instructions": "You are a concierge.", "tools": [],
    "audio": {"input": {"format": PCM, "transcription": {"model": "gpt-4o-mini-transcribe"},
                        "turn_detection": {"type": "semantic_vad", "interrupt_response": True}},
              "output": {"format": PCM, "voice": "ash"}},
}


def updated_session(caller: RtcCaller, count: int) -> dict[str, Any]:
    events = caller.of_type("session.updated")
    assert len(events) == count, caller.of_type("error")
    session: dict[str, Any] = events[-1]["session"]
    return session


@engines
async def test_a_framework_s_default_names_are_taken_and_told_back(
    tiny_server: Served, caller: RtcCaller
) -> None:
    session = session_of(tiny_server, caller)
    caller.send({"type": "session.update", "session": AGENTS_SDK_UPDATE})
    await caller.wait_for("session.updated")
    updated = updated_session(caller, 1)
    assert updated["model"] == "tiny@1" and updated["instructions"] == "You are a concierge."
    audio = updated["audio"]
    assert audio["output"]["voice"] == "default"  # ash: the server's own voice
    assert audio["input"]["transcription"] == {"model": "tiny@1"}
    assert audio["input"]["turn_detection"]["type"] == "semantic_vad"
    assert session.settings.voice == "default" and session.settings.eagerness == "auto"

    # The tiny profile maps OpenAI's higher voices onto its second speaker (profiles.toml).
    caller.send({"type": "session.update", "session": {
        "type": "realtime", "audio": {"output": {"voice": "shimmer"}}}})
    await caller.wait_for("session.updated", count=2)
    assert updated_session(caller, 2)["audio"]["output"]["voice"] == "bright"
    # A name the family speaks is itself, never an alias.
    caller.send({"type": "session.update", "session": {
        "type": "realtime", "audio": {"output": {"voice": "default"}}}})
    await caller.wait_for("session.updated", count=3)
    assert session.settings.voice == "default"
    assert not caller.of_type("error")

    # The call record keeps what each name meant, as the session last used it.
    expected = {"model": {"asked": "gpt-realtime-2.1", "resolved": "tiny@1"},
                "transcription_model": {"asked": "gpt-4o-mini-transcribe", "resolved": "tiny@1"},
                "voice": {"asked": "shimmer", "resolved": "bright"}}
    assert session.aliases == expected
    record = (await get_record(tiny_server.url, call_id_of(caller))).json()
    assert record["aliases"] == expected
    assert_valid_events(caller)


@engines
async def test_with_the_aliases_off_an_update_is_refused_whole_naming_what_it_set(
    tiny_server: Served, caller: RtcCaller
) -> None:
    session = session_of(tiny_server, caller)
    call = tiny_server.app.state.calls.get(call_id_of(caller))
    # This call only: an operator's empty alias tables, today's strict names.
    call.settings = call.settings.model_copy(update={"aliases": AliasSettings(
        models=[], voices={}, transcription_models=[])})
    before = (session.settings.instructions, session.settings.voice, session.settings.eagerness)
    caller.send({"type": "session.update", "event_id": "evt_sdk", "session": AGENTS_SDK_UPDATE})
    error = (await caller.wait_for("error"))["error"]
    assert error["code"] == "invalid_value" and error["event_id"] == "evt_sdk"
    assert "voice 'ash' is not one of this model's voices: default, bright" in error["message"]
    assert error["param"] == "session.audio.output.voice"
    assert ("nothing of this update was applied; it set audio.input.format, "
            "audio.input.transcription, audio.input.turn_detection, audio.output.format, "
            "audio.output.voice, instructions, model, output_modalities, tools") in error["message"]
    assert (session.settings.instructions, session.settings.voice,
            session.settings.eagerness) == before

    voiced = {**AGENTS_SDK_UPDATE, "audio": {"output": {"voice": "bright"}}}
    caller.send({"type": "session.update", "event_id": "evt_model", "session": voiced})
    error = (await caller.wait_for("error", count=2))["error"]
    assert "the model 'gpt-realtime-2.1' is not served here" in error["message"], error
    caller.send({"type": "session.update", "event_id": "evt_asr", "session": {
        "type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}})
    error = (await caller.wait_for("error", count=3))["error"]
    assert error["param"] == "session.audio.input.transcription.model"
    assert "transcription model 'whisper-1' is not served here" in error["message"]
    assert not caller.of_type("session.updated") and session.aliases == {}
    assert (session.settings.instructions, session.settings.voice) == before[:2]

    # The model's own names are always taken.
    caller.send({"type": "session.update", "session": {
        "type": "realtime", "model": "tiny", "audio": {
            "input": {"transcription": {"model": "tiny@1"}}, "output": {"voice": "bright"}}}})
    await caller.wait_for("session.updated")
    assert session.settings.voice == "bright" and session.aliases == {}


def test_a_profile_s_aliases_lie_under_the_operator_s() -> None:
    base = AliasSettings()
    laid = profile_aliases(base, {"voices": {"ash": "bright"}, "models": ["my-model*"]})
    assert laid.voices["ash"] == "bright" and laid.voices["alloy"] == ""  # merged, table by table
    assert laid.models == ["my-model*"]
    chosen = AliasSettings(voices={"ash": "default"})  # set by the operator: the profile's unused
    laid = profile_aliases(chosen, {"voices": {"ash": "bright"}})
    assert laid.voices == {"ash": "default"}
    assert profile_aliases(base, {}) is base
