"""`configure`: a session object's turn detection onto the call's VAD settings, without a call
(pure: no server, no engine). The round trip on a live call is tests/test_client_events.py's."""

from __future__ import annotations

from typing import Any

from openai.types.realtime import RealtimeSessionCreateRequest

from agent.config import ConversationSettings
from agent.realtime.session_config import SessionConfig, configure
from agent.realtime.turn_taking.semantic_turns import PAUSE_MS, turn_ending
from media.vad import VadConfig

# The server's own VAD (OMNIVOX_VAD__*), apart from the class's defaults in what server_vad
# restores: the pause and the silence.
CONFIGURED = VadConfig(pause_ms=300, silence_ms=700)


def session(turn_detection: dict[str, Any]) -> RealtimeSessionCreateRequest:
    return RealtimeSessionCreateRequest.model_validate(
        {"type": "realtime", "audio": {"input": {"turn_detection": turn_detection}}})


def semantic(eagerness: str) -> SessionConfig:
    start = SessionConfig(ConversationSettings(), CONFIGURED)
    return configure(session({"type": "semantic_vad", "eagerness": eagerness}), start, CONFIGURED)


def test_semantic_vad_takes_its_pause_and_its_eagerness_silence() -> None:
    vad = semantic("high").vad
    assert (vad.pause_ms, vad.silence_ms) == (PAUSE_MS, turn_ending("high").silence_ms)


def test_server_vad_after_semantic_vad_restores_the_servers_pause_and_silence() -> None:
    back = configure(session({"type": "server_vad"}), semantic("low"), CONFIGURED)
    assert back.vad == CONFIGURED
    assert back.conversation.eagerness is None


def test_server_vad_values_given_win_over_the_servers() -> None:
    back = configure(session({"type": "server_vad", "silence_duration_ms": 900}),
                     semantic("medium"), CONFIGURED)
    assert (back.vad.pause_ms, back.vad.silence_ms) == (CONFIGURED.pause_ms, 900)
