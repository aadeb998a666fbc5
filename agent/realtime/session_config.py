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
from agent.realtime.turn_taking.semantic_turns import semantic_vad, server_vad
from media.rnnoise_internals import RnnoiseInternalsError, library
from media.vad import VadConfig

MIN_IDLE_TIMEOUT_MS = 1000
MAX_REPLY_TOKENS = 4096  # what "inf" means here: the Thinker's context bounds it anyway
# OpenAI's VAD threshold (0..1) onto webrtcvad's aggressiveness (0..3).
_THRESHOLDS = ((0.35, 0), (0.55, 1), (0.75, 2))


def aggressiveness(threshold: float) -> int:
    return next((mode for limit, mode in _THRESHOLDS if threshold < limit), 3)


class SessionConfigError(ValueError):
    """A session object asking for a value this server refuses (the message names it)."""

    param: str | None = None  # the session field at fault, where one alone is


class UnknownTranscriberError(SessionConfigError):
    """A transcription model this server neither serves nor takes as an alias."""

    param = "session.audio.input.transcription.model"


class NoTranscriptionsError(SessionConfigError):
    """A transcription session asked of a model that does not write speech down."""

    param = "session.type"


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
    refuse_unserved(update)
    conversation = current.conversation.model_copy()
    kind = getattr(update, "type", None)
    if kind is not None:
        conversation.transcription_only = kind == "transcription"
    audio = getattr(update, "audio", None)
    _audio_formats(audio, conversation)
    audio_in = getattr(audio, "input", None)
    if "noise_reduction" in getattr(audio_in, "model_fields_set", ()):  # null turns it off
        _noise_reduction(getattr(audio_in, "noise_reduction", None), conversation)
    detection = getattr(audio_in, "turn_detection", None)
    truncation = getattr(update, "truncation", None)
    if truncation is not None:  # "auto", "disabled", or a retention ratio's share kept
        kept = getattr(truncation, "retention_ratio", truncation)
        if isinstance(kept, float) and not 0.0 < kept <= 1.0:
            _refuse("truncation", "retention_ratio must be over 0 and at most 1")
        conversation.truncation = kept
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


PCM_RATE = 24_000  # audio/pcm's one rate
G711_FORMATS = ("audio/pcmu", "audio/pcma")  # 8 kHz: WebSocket calls only


def refuse_unserved(update: Any) -> None:
    """SessionConfigError naming the first field `update` sets that omnivox does not serve
    (agent/realtime/compatibility.py says why for each), rather than taking and ignoring it."""
    for name in ("prompt", "reasoning"):
        if getattr(update, name, None) is not None:
            _refuse(name, "not served: send instructions")
    if getattr(update, "include", None):
        _refuse("include", "transcription logprobs are not returned")
    limits = getattr(getattr(update, "truncation", None), "token_limits", None)
    if getattr(limits, "post_instructions", None) is not None:
        _refuse("truncation", "token_limits: the Thinker's own context window is the limit")
    audio = getattr(update, "audio", None)
    audio_in, audio_out = getattr(audio, "input", None), getattr(audio, "output", None)
    for side, part in (("input", audio_in), ("output", audio_out)):
        fmt = getattr(part, "format", None)
        if fmt is not None and fmt.type not in G711_FORMATS and (
                fmt.type != "audio/pcm" or getattr(fmt, "rate", None) not in (None, PCM_RATE)):
            _refuse(f"audio.{side}.format", f"audio/pcm at {PCM_RATE} Hz, audio/pcmu and "
                    f"audio/pcma are served, not {fmt.type}")
    reduction = getattr(audio_in, "noise_reduction", None)
    if getattr(reduction, "strength", None) not in (None, 1.0):
        _refuse("audio.input.noise_reduction", "strength 1 only: RNNoise suppresses as it "
                "was trained to, with no setting for how much")
    if getattr(audio_out, "speed", None) not in (None, 1.0):
        _refuse("audio.output.speed", "the voices speak at 1.0 only")


def _audio_formats(audio: Any, conversation: ConversationSettings) -> None:
    """The audio formats `audio` asks for, into `conversation`. A call whose audio is media has
    none (WebRTC: Opus on the track, formats None): audio/pcm at 24 kHz, what OpenAI's SDKs
    and LiveKit send on every transport, is taken as it is; G.711 is refused, not taken and
    ignored, since a gateway that asks for it would get no G.711 anywhere on such a call."""
    for side in ("input", "output"):
        fmt = getattr(getattr(audio, side, None), "format", None)
        if fmt is None:
            continue
        if getattr(conversation, f"{side}_format") is None:
            if fmt.type in G711_FORMATS:
                _refuse(f"audio.{side}.format", f"{fmt.type} applies to WebSocket calls only: "
                        "a WebRTC call's audio is Opus on its media track")
            continue
        setattr(conversation, f"{side}_format", fmt.type)


def _noise_reduction(reduction: Any, conversation: ConversationSettings) -> None:
    """`audio.input.noise_reduction` into `conversation`: its type (one left out keeps the
    current one, near_field when off), or None. The suppressor's library is loaded here, once
    a process, so a broken one refuses the update rather than failing in the call."""
    if reduction is None:
        conversation.noise_reduction = None
        return
    try:
        library()
    except RnnoiseInternalsError as exc:
        _refuse("audio.input.noise_reduction", f"the noise suppressor cannot run: {exc}")
    conversation.noise_reduction = reduction.type or conversation.noise_reduction or "near_field"


def _refuse(field: str, why: str) -> None:
    error = SessionConfigError(f"{field}: {why}")
    error.param = f"session.{field}"
    raise error


def transcription_model(update: Any) -> str | None:
    """The transcription model a session object names (`audio.input.transcription.model`)."""
    audio_in = getattr(getattr(update, "audio", None), "input", None)
    return getattr(getattr(audio_in, "transcription", None), "model", None)


def update_fields(update: Any) -> list[str]:
    """The fields a session object sets, `audio`'s by their path (`audio.output.voice`)."""
    fields: list[str] = []
    for name in sorted(set(getattr(update, "model_fields_set", ())) - {"type"}):
        value = getattr(update, name)
        if name != "audio" or value is None:
            fields.append(name)
            continue
        for side in ("input", "output"):
            part = getattr(value, side, None)
            fields += [f"audio.{side}.{field}" for field in sorted(
                getattr(part, "model_fields_set", ()))]
    return fields


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
        conversation.idle_timeout_ms = None  # OpenAI's idle timeout is server_vad's alone
        return semantic_vad(current, conversation.eagerness)
    if detection.type != "server_vad":
        raise SessionConfigError(f"turn_detection {detection.type!r} is not supported "
                                 "(server_vad, semantic_vad)")
    if conversation.eagerness is not None:  # from semantic_vad: its pause and silence go
        conversation.eagerness = None
        current = server_vad(current, configured)
    if "idle_timeout_ms" in detection.model_fields_set:
        idle = detection.idle_timeout_ms
        if idle is not None and idle < MIN_IDLE_TIMEOUT_MS:
            raise SessionConfigError(f"turn_detection: idle_timeout_ms must be at least "
                                     f"{MIN_IDLE_TIMEOUT_MS}")
        conversation.idle_timeout_ms = idle
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
