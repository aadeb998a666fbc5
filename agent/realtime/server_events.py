"""Every Realtime server event omnivox sends, and the objects inside them (session, items,
responses), shaped as OpenAI's GA API has them; the only module that spells a server event type."""

from __future__ import annotations

import json
import uuid
from typing import Any

from agent.config import ConversationSettings
from agent.realtime.history import Item
from media.vad import VadConfig

Event = dict[str, Any]


def new_id(prefix: str) -> str:
    """An id in OpenAI's style: a short prefix and 20 hex digits."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def server_event(event_type: str, **fields: Any) -> Event:
    """A server event with a fresh event_id (the builders below are its only callers)."""
    return {"type": event_type, "event_id": new_id("event"), **fields}


# -- objects inside events --------------------------------------------------------------------


def session_object(
    session_id: str, profile: str, conversation: ConversationSettings, vad: VadConfig,
    tools: list[dict[str, Any]] | None = None, tool_choice: str | dict[str, str] = "auto",
) -> dict[str, Any]:
    """The session as `session.created` / `session.updated` (and a client secret) carry it:
    the caller's speech is always transcribed, by the model itself (`profile`). The audio
    formats are a WebSocket call's choice; a call with none (WebRTC: Opus media) reports the
    default, audio/pcm at 24 kHz, which is all it takes."""
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": profile,
        "instructions": conversation.instructions,
        "output_modalities": modalities(conversation.text_only),
        "audio": {
            "input": {
                "format": audio_format(conversation.input_format),
                "transcription": {"model": profile},
                "turn_detection": turn_detection(conversation, vad),
                "noise_reduction": noise_reduction(conversation),
            },
            "output": {"format": audio_format(conversation.output_format),
                       "voice": conversation.voice},
        },
        "max_output_tokens": conversation.max_reply_tokens,
        "truncation": truncation_field(conversation.truncation),
        "tools": tools or [],
        "tool_choice": tool_choice,
    }


def truncation_field(truncation: str | float) -> str | dict[str, Any]:
    """A session's `truncation`: auto, disabled, or its retention ratio."""
    if isinstance(truncation, str):
        return truncation
    return {"type": "retention_ratio", "retention_ratio": truncation}


def audio_format(name: str | None) -> dict[str, Any]:
    """A session's audio format as the protocol spells it (None, a WebRTC call's: pcm)."""
    return {"type": "audio/pcm", "rate": 24000} if name in (None, "audio/pcm") else {"type": name}


def transcription_session_object(session_id: str, profile: str,
                                 conversation: ConversationSettings,
                                 vad: VadConfig) -> dict[str, Any]:
    """A transcription session (session.type transcription) as session.updated carries it."""
    return {
        "type": "transcription",
        "object": "realtime.transcription_session",
        "id": session_id,
        "audio": {"input": {"format": audio_format(conversation.input_format),
                            "transcription": {"model": profile},
                            "turn_detection": turn_detection(conversation, vad),
                            "noise_reduction": noise_reduction(conversation)}},
        "include": [],
    }


def noise_reduction(conversation: ConversationSettings) -> dict[str, str] | None:
    """The session's `audio.input.noise_reduction`: its type, or None when off."""
    kind = conversation.noise_reduction
    return {"type": kind} if kind is not None else None


def input_audio_transcription_failed(item_id: str, message: str) -> Event:
    """`conversation.item.input_audio_transcription.failed`: the utterance was not heard."""
    return server_event("conversation.item.input_audio_transcription.failed", item_id=item_id,
                        content_index=0, error={"type": "server_error",
                                                "code": "transcription_failed",
                                                "message": message, "param": None})


def turn_detection(conversation: ConversationSettings, vad: VadConfig) -> dict[str, Any] | None:
    """The session's `turn_detection`: server_vad's settings, semantic_vad's eagerness, or
    None when the client commits turns."""
    if not conversation.server_vad:
        return None
    common = {"interrupt_response": conversation.barge_in,
              "create_response": conversation.create_response}
    if conversation.eagerness is not None:
        return {"type": "semantic_vad", "eagerness": conversation.eagerness, **common}
    return {
        "type": "server_vad",
        # a threshold that client_events.aggressiveness maps back to this mode
        "threshold": (vad.aggressiveness + 0.5) / 4,
        "prefix_padding_ms": vad.preroll_ms,
        "silence_duration_ms": vad.silence_ms,
        "idle_timeout_ms": conversation.idle_timeout_ms,
        **common,
    }


def modalities(text_only: bool) -> list[str]:
    """A session's or a response's `output_modalities`: text alone, or audio (with its
    transcript)."""
    return ["text"] if text_only else ["audio"]


def _user_item(item_id: str, content: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [content],
    }


def user_audio_item(item_id: str, transcript: str | None) -> dict[str, Any]:
    """The caller's utterance as a conversation item."""
    return _user_item(item_id, {"type": "input_audio", "transcript": transcript})


def user_text_item(item_id: str, text: str) -> dict[str, Any]:
    """A typed user message as a conversation item."""
    return _user_item(item_id, {"type": "input_text", "text": text})


def assistant_item(
    item_id: str, transcript: str, status: str, text_only: bool = False
) -> dict[str, Any]:
    """The agent's reply as a conversation item: spoken (its transcript), or text alone."""
    content = ({"type": "output_text", "text": transcript} if text_only
               else {"type": "output_audio", "transcript": transcript})
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [content],
    }


def response_object(
    response_id: str,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    reason: str | None = None,
    error: str | None = None,
    text_only: bool = False,
    metadata: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A response object; status is in_progress, completed, cancelled or failed. `metadata`:
    the client's, from its response.create, given back as it came."""
    body: dict[str, Any] = {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "output": output,
        "output_modalities": modalities(text_only),
        "metadata": metadata,
    }
    if status in ("cancelled", "failed", "incomplete"):
        details: dict[str, Any] = {"type": status}
        if reason:
            details["reason"] = reason
        if error:
            details["error"] = {"type": "server_error", "message": error}
        body["status_details"] = details
    if usage is not None:
        body["usage"] = usage
    return body


def usage_object(pipeline_usage: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's usage object from the pipeline's counts: the Thinker's prompt (and how much of
    it the engine's prefix cache held), the text and speech tokens generated."""
    text = int(pipeline_usage.get("thinker_tokens", 0))
    audio = int(pipeline_usage.get("speech_tokens", 0))
    prompt = int(pipeline_usage.get("prompt_tokens", 0))
    cached = int(pipeline_usage.get("cached_tokens", 0))
    return {
        "total_tokens": prompt + text + audio,
        "input_tokens": prompt,
        "input_token_details": {"cached_tokens": cached},
        "output_tokens": text + audio,
        "output_token_details": {"text_tokens": text, "audio_tokens": audio},
    }


# -- session ----------------------------------------------------------------------------------


def session_created(session: dict[str, Any], resume: dict[str, Any] | None = None) -> Event:
    """`session.created`: the first event of every call; on a call its caller may resume after
    a drop, `resume` (omnivox's own field: the token and its grace, agent/calls/resume.py)."""
    if resume is None:
        return server_event("session.created", session=session)
    return server_event("session.created", session=session, resume=resume)


def session_updated(session: dict[str, Any]) -> Event:
    """`session.updated`: the session after a `session.update` was applied."""
    return server_event("session.updated", session=session)


# -- the caller's audio and the conversation --------------------------------------------------


def speech_started(item_id: str, audio_start_ms: int) -> Event:
    """`input_audio_buffer.speech_started`: the VAD heard the caller begin."""
    return server_event(
        "input_audio_buffer.speech_started", audio_start_ms=audio_start_ms, item_id=item_id
    )


def speech_stopped(item_id: str, audio_end_ms: int) -> Event:
    """`input_audio_buffer.speech_stopped`: the VAD closed the utterance."""
    return server_event(
        "input_audio_buffer.speech_stopped", audio_end_ms=audio_end_ms, item_id=item_id
    )


def dtmf_event_received(digit: str, received_at: int) -> Event:
    """`input_audio_buffer.dtmf_event_received`: the caller pressed a key (0-9 * # A-D) at
    `received_at` (Unix seconds, when the server got it)."""
    return server_event(
        "input_audio_buffer.dtmf_event_received", event=digit, received_at=received_at
    )


def input_audio_buffer_committed(item_id: str) -> Event:
    """`input_audio_buffer.committed`: the utterance became a conversation item."""
    return server_event("input_audio_buffer.committed", item_id=item_id, previous_item_id=None)


def input_audio_buffer_timeout_triggered(item_id: str, audio_start_ms: int,
                                         audio_end_ms: int) -> Event:
    """`input_audio_buffer.timeout_triggered`: the caller stayed silent past idle_timeout_ms."""
    return server_event("input_audio_buffer.timeout_triggered", item_id=item_id,
                        audio_start_ms=audio_start_ms, audio_end_ms=audio_end_ms)


def input_audio_buffer_cleared() -> Event:
    """`input_audio_buffer.cleared`: the caller's audio so far was dropped."""
    return server_event("input_audio_buffer.cleared")


def conversation_item_added(item: dict[str, Any]) -> Event:
    """`conversation.item.added`: `item` joined the conversation (a reply's, still empty)."""
    return server_event("conversation.item.added", item=item, previous_item_id=None)


def conversation_item_done(item: dict[str, Any]) -> Event:
    """`conversation.item.done`: `item` is final (a reply's once it ended, the caller's
    utterance once committed: its transcript comes in transcription events)."""
    return server_event("conversation.item.done", item=item, previous_item_id=None)


def conversation_item_retrieved(item: dict[str, Any]) -> Event:
    """`conversation.item.retrieved`: the item a client asked for, as the history holds it."""
    return server_event("conversation.item.retrieved", item=item)


def conversation_item_deleted(item_id: str) -> Event:
    """`conversation.item.deleted`: the item left the history."""
    return server_event("conversation.item.deleted", item_id=item_id)


def item_added_and_done(item: dict[str, Any]) -> list[Event]:
    """A whole item joining the conversation: a typed message, a function's output, the
    caller's committed utterance."""
    return [conversation_item_added(item), conversation_item_done(item)]


def input_audio_transcription_delta(item_id: str, delta: str) -> Event:
    """`conversation.item.input_audio_transcription.delta`: more of what the caller said."""
    return server_event("conversation.item.input_audio_transcription.delta", item_id=item_id,
                        content_index=0, delta=delta)


def input_audio_transcription_completed(item_id: str, transcript: str) -> Event:
    """`conversation.item.input_audio_transcription.completed`: what the caller said."""
    # OpenAI's model requires a usage; omnivox does not meter transcription on its own.
    return server_event(
        "conversation.item.input_audio_transcription.completed",
        item_id=item_id,
        content_index=0,
        transcript=transcript,
        usage={"type": "duration", "seconds": 0},
    )


def conversation_item_truncated(item_id: str, audio_end_ms: int) -> Event:
    """`conversation.item.truncated`: the item keeps its first `audio_end_ms` of audio."""
    return server_event(
        "conversation.item.truncated", item_id=item_id, content_index=0, audio_end_ms=audio_end_ms
    )


def function_call_item(item_id: str, call_id: str, name: str, arguments: str,
                       status: str) -> dict[str, Any]:
    """A call of one of the session's functions, as the agent made it."""
    return {"id": item_id, "object": "realtime.item", "type": "function_call", "status": status,
            "call_id": call_id, "name": name, "arguments": arguments}


def history_item(item: Item, status: str, text_only: bool = False) -> dict[str, Any]:
    """An item of the call's history as the protocol shows it (conversation.item.retrieved)."""
    if item.role == "user":
        return (user_audio_item(item.item_id, item.text) if item.heard
                else user_text_item(item.item_id, item.text))
    if item.role == "tool":
        return function_call_output_item(item.item_id, item.call_id or "", item.text)
    if item.call_id is not None:  # the agent's call, kept as the Thinker writes it
        call = json.loads(item.text)
        return function_call_item(item.item_id, item.call_id, call["name"],
                                  json.dumps(call["arguments"]), status)
    return assistant_item(item.item_id, item.text, status, text_only)


def function_call_output_item(item_id: str, call_id: str, output: str) -> dict[str, Any]:
    """What the client's function returned, for the call `call_id`."""
    return {"id": item_id, "object": "realtime.item", "type": "function_call_output",
            "status": "completed", "call_id": call_id, "output": output}


# -- responses --------------------------------------------------------------------------------


def response_created(response_id: str, text_only: bool = False,
                     metadata: dict[str, str] | None = None) -> Event:
    """`response.created`: a reply began, with no output yet."""
    response = response_object(response_id, "in_progress", [], text_only=text_only,
                               metadata=metadata)
    return server_event("response.created", response=response)


def output_item_added(response_id: str, item: dict[str, Any]) -> Event:
    """`response.output_item.added`: the reply's one item (audio, text or a function call), as
    it begins."""
    return server_event(
        "response.output_item.added", response_id=response_id, output_index=0, item=item
    )


def output_item_done(response_id: str, item: dict[str, Any]) -> Event:
    """`response.output_item.done`: the reply's one item, as it ended."""
    return server_event(
        "response.output_item.done", response_id=response_id, output_index=0, item=item
    )


def function_call_arguments_delta(response_id: str, item_id: str, call_id: str,
                                  delta: str) -> Event:
    """`response.function_call_arguments.delta`: more of a call's JSON arguments."""
    return server_event("response.function_call_arguments.delta", response_id=response_id,
                        item_id=item_id, output_index=0, call_id=call_id, delta=delta)


def function_call_arguments_done(response_id: str, item_id: str, call_id: str, name: str,
                                 arguments: str) -> Event:
    """`response.function_call_arguments.done`: a call's arguments, whole and valid JSON."""
    return server_event("response.function_call_arguments.done", response_id=response_id,
                        item_id=item_id, output_index=0, call_id=call_id, name=name,
                        arguments=arguments)


def _audio_content_event(event_type: str, response_id: str, item_id: str, **fields: Any) -> Event:
    """An event about the content (audio, or text alone) of the reply's one output item."""
    return server_event(
        event_type,
        response_id=response_id,
        item_id=item_id,
        output_index=0,
        content_index=0,
        **fields,
    )


def output_audio_transcript_delta(response_id: str, item_id: str, delta: str) -> Event:
    """`response.output_audio_transcript.delta`: more of the reply's text."""
    return _audio_content_event(
        "response.output_audio_transcript.delta", response_id, item_id, delta=delta
    )


def output_audio_transcript_done(response_id: str, item_id: str, transcript: str) -> Event:
    """`response.output_audio_transcript.done`: the reply's whole text."""
    return _audio_content_event(
        "response.output_audio_transcript.done", response_id, item_id, transcript=transcript
    )


def output_audio_delta(response_id: str, item_id: str, audio: str) -> Event:
    """`response.output_audio.delta`: more of the reply's audio, base64 pcm16 24 kHz mono
    (WebSocket calls; a WebRTC call hears it on its track instead)."""
    return _audio_content_event("response.output_audio.delta", response_id, item_id,
                                delta=audio)


def output_text_delta(response_id: str, item_id: str, delta: str) -> Event:
    """`response.output_text.delta`: more of a text-only reply."""
    return _audio_content_event("response.output_text.delta", response_id, item_id, delta=delta)


def output_text_done(response_id: str, item_id: str, text: str) -> Event:
    """`response.output_text.done`: a text-only reply's whole text."""
    return _audio_content_event("response.output_text.done", response_id, item_id, text=text)


def output_audio_done(response_id: str, item_id: str) -> Event:
    """`response.output_audio.done`: the reply's audio is all generated."""
    return _audio_content_event("response.output_audio.done", response_id, item_id)


def response_done(response: dict[str, Any]) -> Event:
    """`response.done`: the reply ended (completed, cancelled or failed)."""
    return server_event("response.done", response=response)


# -- the agent's audio on the call ------------------------------------------------------------


def output_audio_buffer_started(response_id: str) -> Event:
    """`output_audio_buffer.started`: the reply's first audio went out."""
    return server_event("output_audio_buffer.started", response_id=response_id)


def output_audio_buffer_stopped(response_id: str) -> Event:
    """`output_audio_buffer.stopped`: the reply's audio played out to its end."""
    return server_event("output_audio_buffer.stopped", response_id=response_id)


def output_audio_buffer_cleared(response_id: str) -> Event:
    """`output_audio_buffer.cleared`: the reply's audio was cut off (barge-in or a client)."""
    return server_event("output_audio_buffer.cleared", response_id=response_id)


# -- errors -----------------------------------------------------------------------------------


def error_event(
    message: str,
    *,
    code: str,
    error_type: str = "invalid_request_error",
    event_id: str | None = None,
    param: str | None = None,
) -> Event:
    """An `error` server event; event_id names the client event that caused it."""
    error = {
        "type": error_type,
        "code": code,
        "message": message,
        "param": param,
        "event_id": event_id,
    }
    return server_event("error", error=error)


def stage_failed_event(stage: str, reason: str) -> Event:
    """The `error` event a live call gets when one of the stages is marked failed."""
    return error_event(
        f"stage {stage} failed and will not be restarted ({reason}); replies fail until the "
        f"server is restarted",
        code="stage_failed",
        error_type="server_error",
    )
