"""A Realtime session object (the call's `session` at its start, or a `session.update`) turned
into the conversation, VAD and tool settings it asks for: every change, or a ValueError and
none."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from agent.config import ConversationSettings
from agent.realtime.function_calls import SessionTools, ToolsError, configure_tools
from agent.realtime.history import Conversation
from agent.realtime.semantic_turns import semantic_vad, server_vad
from media.vad import VadConfig

MAX_REPLY_TOKENS = 4096  # what "inf" means here: the Thinker's context bounds it anyway
# OpenAI's VAD threshold (0..1) onto webrtcvad's aggressiveness (0..3).
_THRESHOLDS = ((0.35, 0), (0.55, 1), (0.75, 2))


def aggressiveness(threshold: float) -> int:
    return next((mode for limit, mode in _THRESHOLDS if threshold < limit), 3)


class SessionConfigError(ValueError):
    """A session object asking for a value this server refuses (the message names it)."""

    param: str | None = None  # the session field at fault, where one alone is


@dataclass(frozen=True)
class SessionConfig:
    """What a call's conversation, its VAD and its function calling run with."""

    conversation: ConversationSettings
    vad: VadConfig
    tools: SessionTools = field(default_factory=SessionTools)


@dataclass(frozen=True)
class SavedConversation:
    """A dropped call's conversation, kept for its caller to resume (agent/calls/resume.py):
    its history and the settings its session ran with."""

    history: Conversation
    config: SessionConfig


def configure(update: Any, current: SessionConfig, configured_vad: VadConfig) -> SessionConfig:
    """`current` with the changes the session object `update` asks for (openai's
    `RealtimeSessionCreateRequest` shape); SessionConfigError naming the first value refused.
    `configured_vad` is the server's own VAD (settings.vad), what server_vad goes back to."""
    conversation = current.conversation.model_copy()
    audio = getattr(update, "audio", None)
    audio_in = getattr(audio, "input", None)
    detection = getattr(audio_in, "turn_detection", None)
    max_tokens = getattr(update, "max_output_tokens", None)
    if max_tokens is not None:
        if max_tokens != "inf" and not 1 <= max_tokens <= MAX_REPLY_TOKENS:
            raise SessionConfigError(f"max_output_tokens must be 1..{MAX_REPLY_TOKENS} or 'inf'")
        conversation.max_reply_tokens = MAX_REPLY_TOKENS if max_tokens == "inf" else max_tokens
    if getattr(update, "instructions", None) is not None:
        conversation.instructions = update.instructions
    output = getattr(audio, "output", None) if audio else None
    if output is not None and output.voice is not None:
        conversation.voice = getattr(output.voice, "id", output.voice)  # a custom voice
    output_modalities = getattr(update, "output_modalities", None)
    if output_modalities is not None:
        conversation.text_only = text_only(output_modalities)
    vad = current.vad
    if detection is None and "turn_detection" in getattr(audio_in, "model_fields_set", ()):
        conversation.server_vad = False  # `turn_detection: null`: the client commits turns
    if detection is not None:
        conversation.server_vad = True
        vad = _vad(detection, vad, conversation, configured_vad)
        if detection.interrupt_response is not None:
            conversation.barge_in = detection.interrupt_response
        if detection.create_response is not None:
            conversation.create_response = detection.create_response
    try:
        tools = configure_tools(update, current.tools)
    except ToolsError as exc:
        raise SessionConfigError(str(exc)) from None
    return SessionConfig(conversation, vad, tools)


def text_only(output_modalities: list[str]) -> bool:
    """Whether `output_modalities` asks for text alone; SessionConfigError if for nothing."""
    if not output_modalities:
        raise SessionConfigError("output_modalities must name 'audio' or 'text'")
    return "audio" not in output_modalities


def _vad(detection: Any, current: VadConfig, conversation: ConversationSettings,
         configured: VadConfig) -> VadConfig:
    """The VAD settings `detection` asks for (and the conversation's eagerness);
    SessionConfigError if they are not valid."""
    if detection.type == "semantic_vad":
        conversation.eagerness = detection.eagerness or conversation.eagerness or "auto"
        return semantic_vad(current, conversation.eagerness)
    if detection.type != "server_vad":
        raise SessionConfigError(f"turn_detection {detection.type!r} is not supported "
                                 "(server_vad, semantic_vad)")
    if conversation.eagerness is not None:  # from semantic_vad: its pause and silence go
        conversation.eagerness = None
        current = server_vad(current, configured)
    changes: dict[str, int] = {}
    if detection.silence_duration_ms is not None:
        changes["silence_ms"] = detection.silence_duration_ms
    if detection.prefix_padding_ms is not None:
        changes["preroll_ms"] = detection.prefix_padding_ms
    if detection.threshold is not None:
        changes["aggressiveness"] = aggressiveness(detection.threshold)
    try:
        return dataclasses.replace(current, **changes)
    except ValidationError as exc:  # one line for the caller, not pydantic's report
        first = exc.errors()[0]
        raise SessionConfigError(f"turn_detection: {first['loc'][-1]}: {first['msg']}") from None
