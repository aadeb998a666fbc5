"""Every server event builder makes an event OpenAI's own models accept (`openai.types.realtime`),
with the type it is named for: no engine, no call, so every builder is checked on every run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from agent.config import ConversationSettings
from agent.realtime import server_events as ev
from media.vad import VadConfig

SERVER_EVENT = TypeAdapter(RealtimeServerEvent)
ITEM = ev.assistant_item("item_1", "Hello there.", "completed")
SESSION = ev.session_object("rtc_1", "tiny", ConversationSettings(), VadConfig())
RESPONSE = ev.response_object("resp_1", "completed", [ITEM], usage=ev.usage_object(
    {"prompt_tokens": 5, "thinker_tokens": 3, "speech_tokens": 40}))
CANCELLED = ev.response_object("resp_2", "cancelled", [ITEM], reason="turn_detected")

BUILT: dict[str, Callable[[], dict[str, Any]]] = {
    "session.created": lambda: ev.session_created(SESSION),
    "session.updated": lambda: ev.session_updated(SESSION),
    "input_audio_buffer.speech_started": lambda: ev.speech_started("item_2", 120),
    "input_audio_buffer.speech_stopped": lambda: ev.speech_stopped("item_2", 1_400),
    "input_audio_buffer.committed": lambda: ev.input_audio_buffer_committed("item_2"),
    "input_audio_buffer.cleared": ev.input_audio_buffer_cleared,
    "input_audio_buffer.timeout_triggered":
        lambda: ev.input_audio_buffer_timeout_triggered("item_4", 5_000, 11_000),
    "conversation.item.added": lambda: ev.conversation_item_added(
        ev.user_audio_item("item_2", None)),
    "conversation.item.done": lambda: ev.conversation_item_done(
        ev.user_audio_item("item_2", "what time is it")),
    "conversation.item.retrieved": lambda: ev.conversation_item_retrieved(ITEM),
    "conversation.item.deleted": lambda: ev.conversation_item_deleted("item_1"),
    "conversation.item.input_audio_transcription.delta":
        lambda: ev.input_audio_transcription_delta("item_2", "what time is it"),
    "conversation.item.input_audio_transcription.failed":
        lambda: ev.input_audio_transcription_failed("item_2", "the recogniser stopped"),
    "conversation.item.input_audio_transcription.completed":
        lambda: ev.input_audio_transcription_completed("item_2", "what time is it"),
    "conversation.item.truncated": lambda: ev.conversation_item_truncated("item_1", 640),
    "response.created": lambda: ev.response_created("resp_1"),
    "response.output_item.added": lambda: ev.output_item_added("resp_1", ITEM),
    "response.output_item.done": lambda: ev.output_item_done("resp_1", ITEM),
    "response.output_audio_transcript.delta":
        lambda: ev.output_audio_transcript_delta("resp_1", "item_1", "Hel"),
    "response.output_audio_transcript.done":
        lambda: ev.output_audio_transcript_done("resp_1", "item_1", "Hello there."),
    "response.output_audio.done": lambda: ev.output_audio_done("resp_1", "item_1"),
    "response.output_audio.delta": lambda: ev.output_audio_delta("resp_1", "item_1", "AAA="),
    "response.output_text.delta": lambda: ev.output_text_delta("resp_1", "item_1", "Hel"),
    "response.output_text.done": lambda: ev.output_text_done("resp_1", "item_1", "Hello."),
    "response.done": lambda: ev.response_done(RESPONSE),
    "output_audio_buffer.started": lambda: ev.output_audio_buffer_started("resp_1"),
    "output_audio_buffer.stopped": lambda: ev.output_audio_buffer_stopped("resp_1"),
    "output_audio_buffer.cleared": lambda: ev.output_audio_buffer_cleared("resp_1"),
    "response.function_call_arguments.delta": lambda: ev.function_call_arguments_delta(
        "resp_1", "item_3", "call_1", '{"city": "Paris"}'),
    "response.function_call_arguments.done": lambda: ev.function_call_arguments_done(
        "resp_1", "item_3", "call_1", "get_weather", '{"city": "Paris"}'),
    "input_audio_buffer.dtmf_event_received": lambda: ev.dtmf_event_received("5", 1_700_000_000),
    "error": lambda: ev.error_event("bad", code="invalid_value", event_id="evt_1", param="x"),
}


@pytest.mark.parametrize("event_type", sorted(BUILT))
def test_each_builder_makes_a_valid_event_of_its_type(event_type: str) -> None:
    event = BUILT[event_type]()
    parsed = SERVER_EVENT.validate_python(event)
    assert parsed.type == event_type == event["type"]
    assert event["event_id"].startswith("event_")


def test_text_only_and_manual_turn_sessions_and_replies_are_valid_too() -> None:
    settings = ConversationSettings(text_only=True, server_vad=False)
    session = ev.session_object("sess_1", "tiny", settings, VadConfig())
    assert session["output_modalities"] == ["text"]
    assert session["audio"]["input"]["turn_detection"] is None
    item = ev.assistant_item("item_1", "Hello.", "completed", text_only=True)
    response = ev.response_object("resp_1", "completed", [item], text_only=True)
    for event in (ev.session_updated(session), ev.response_done(response),
                  ev.response_created("resp_1", text_only=True)):
        SERVER_EVENT.validate_python(event)
    assert response["output_modalities"] == ["text"]
    assert item["content"] == [{"type": "output_text", "text": "Hello."}]


def test_a_cancelled_response_and_a_stage_failure_are_valid_too() -> None:
    done = SERVER_EVENT.validate_python(ev.response_done(CANCELLED))
    assert done.response.status == "cancelled"
    assert done.response.status_details.reason == "turn_detected"
    failed = SERVER_EVENT.validate_python(ev.stage_failed_event("talker", "gave up"))
    assert failed.error.code == "stage_failed" and "talker" in failed.error.message


def test_the_session_object_carries_the_settings_it_was_given() -> None:
    conversation = ConversationSettings(instructions="Be brief.", voice="alloy",
                                        barge_in=False, max_reply_tokens=32)
    session = ev.session_object("rtc_2", "local", conversation, VadConfig(silence_ms=800))
    detection = session["audio"]["input"]["turn_detection"]
    assert session["instructions"] == "Be brief." and session["max_output_tokens"] == 32
    assert session["audio"]["output"]["voice"] == "alloy"
    assert detection["silence_duration_ms"] == 800 and detection["interrupt_response"] is False


def test_a_transcription_session_is_valid_too() -> None:
    settings = ConversationSettings(transcription_only=True)
    session = ev.transcription_session_object("rtc_3", "local@1", settings, VadConfig())
    parsed = SERVER_EVENT.validate_python(ev.session_updated(session))
    assert parsed.session.type == "transcription"
    assert session["audio"]["input"]["transcription"] == {"model": "local@1"}
