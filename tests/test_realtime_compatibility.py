"""The compatibility table (agent/realtime/compatibility.py) against what it describes: every
GA client and server event and session field of the `openai` package is placed in it (a new
SDK release that adds one fails here), what it calls served has a handler or a builder, what it
calls refused is refused by a session.update, and the docs are generated from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
from openai.types.realtime import (
    RealtimeClientEvent,
    RealtimeServerEvent,
    RealtimeSessionCreateRequest,
    SessionUpdateEvent,
)
from openai.types.realtime.realtime_audio_config_input import RealtimeAudioConfigInput
from openai.types.realtime.realtime_audio_config_output import RealtimeAudioConfigOutput

from agent.config import ConversationSettings
from agent.realtime import compatibility
from agent.realtime.client_events import ClientEvents
from agent.realtime.session_config import SessionConfig, SessionConfigError, configure
from media.vad import VadConfig
from tests.test_server_events import BUILT

DOC = Path(__file__).resolve().parent.parent / "docs" / "realtime-compatibility.md"


def event_types(union: Any) -> set[str]:
    return {get_args(m.model_fields["type"].annotation)[0] for m in get_args(get_args(union)[0])}


def session_fields() -> set[str]:
    top = set(RealtimeSessionCreateRequest.model_fields) - {"audio"}
    return (top | {f"audio.input.{f}" for f in RealtimeAudioConfigInput.model_fields}
            | {f"audio.output.{f}" for f in RealtimeAudioConfigOutput.model_fields})


def test_every_event_and_field_of_the_sdk_is_placed() -> None:
    assert set(compatibility.CLIENT_EVENTS) == event_types(RealtimeClientEvent)
    assert set(compatibility.SERVER_EVENTS) == event_types(RealtimeServerEvent)
    assert set(compatibility.SESSION_FIELDS) == session_fields()


def test_what_is_called_served_is_served() -> None:
    served = {name for name, s in compatibility.CLIENT_EVENTS.items() if s.status == "served"}
    handled = set(ClientEvents(session=None).handlers)  # type: ignore[arg-type]
    assert served == handled | {"input_audio_buffer.append"}  # a WebSocket call's own
    sent = {name for name, s in compatibility.SERVER_EVENTS.items() if s.status == "served"}
    assert sent <= set(BUILT), sorted(sent - set(BUILT))  # each built and checked valid there


# One value per refused (or not yet served) field, as a client would send it.
UNSERVED: dict[str, dict[str, Any]] = {
    "audio.input.noise_reduction": {"audio": {"input": {"noise_reduction": {
        "type": "near_field", "strength": 0.5}}}},  # served, strength 1 only
    "audio.output.speed": {"audio": {"output": {"speed": 1.25}}},
    "include": {"include": ["item.input_audio_transcription.logprobs"]},
    "prompt": {"prompt": {"id": "pmpt_1"}},
    "reasoning": {"reasoning": {"effort": "low"}},
    "truncation": {"truncation": {"type": "retention_ratio", "retention_ratio": 0.5,
                                  "token_limits": {"post_instructions": 1000}}},
}


def configured(fields: dict[str, Any]) -> SessionConfig:
    update = SessionUpdateEvent.model_validate(
        {"type": "session.update", "session": {"type": "realtime", **fields}}).session
    start = SessionConfig(ConversationSettings(), VadConfig())
    return configure(update, start, VadConfig())


@pytest.mark.parametrize("field", sorted(UNSERVED))
def test_a_field_not_served_is_refused_naming_it(field: str) -> None:
    with pytest.raises(SessionConfigError) as refused:
        configured(UNSERVED[field])
    assert refused.value.param == f"session.{field}"
    assert str(refused.value).startswith(f"{field}: ")
    top = field if field in compatibility.SESSION_FIELDS else field.rsplit(".", 1)[0]
    assert compatibility.SESSION_FIELDS[top].note, top


def test_what_frameworks_send_by_default_is_taken() -> None:
    """The values that mean "as usual": the served format, speed 1, no noise reduction,
    truncation auto, and tracing (not applicable: accepted, unused)."""
    config = configured({
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                            "noise_reduction": None},
                  "output": {"format": {"type": "audio/pcm", "rate": 24000}, "speed": 1.0}},
        "truncation": "auto", "tracing": "auto", "parallel_tool_calls": True})
    assert config.conversation.server_vad


def test_the_docs_table_is_generated_from_the_code() -> None:
    assert DOC.read_text() == compatibility.markdown(), (
        "regenerate: python -m agent.realtime.compatibility > docs/realtime-compatibility.md")
