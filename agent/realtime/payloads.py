"""The objects inside Realtime events (items, responses), shaped as OpenAI's GA API has them."""

from __future__ import annotations

from typing import Any

from media.vad import VadConfig


def session_object(
    session_id: str,
    model: str,
    instructions: str,
    voice: str,
    vad: VadConfig,
    *,
    interrupt: bool,
    create_response: bool,
    max_output_tokens: int | None = None,
) -> dict[str, Any]:
    """The session as `session.created` / `session.updated` carry it."""
    pcm = {"type": "audio/pcm", "rate": 24000}
    session: dict[str, Any] = {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": model,
        "instructions": instructions,
        "output_modalities": ["audio"],
        "audio": {
            "input": {
                "format": pcm,
                "turn_detection": {
                    "type": "server_vad",
                    "threshold": (vad.aggressiveness + 0.5) / 4,
                    "prefix_padding_ms": vad.preroll_ms,
                    "silence_duration_ms": vad.silence_ms,
                    "interrupt_response": interrupt,
                    "create_response": create_response,
                },
            },
            "output": {"format": pcm, "voice": voice},
        },
    }
    if max_output_tokens is not None:
        session["max_output_tokens"] = max_output_tokens
    return session


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


def assistant_item(item_id: str, transcript: str, status: str) -> dict[str, Any]:
    """The agent's spoken reply as a conversation item."""
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_audio", "transcript": transcript}],
    }


def response(
    response_id: str,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    reason: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A response object; status is in_progress, completed, cancelled or failed."""
    body: dict[str, Any] = {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "output": output,
        "output_modalities": ["audio"],
    }
    if status in ("cancelled", "failed", "incomplete"):
        details: dict[str, Any] = {"type": status}
        if reason:
            details["reason"] = reason
        if error:
            details["error"] = error
        body["status_details"] = details
    if usage is not None:
        body["usage"] = usage
    return body


def usage(pipeline_usage: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's usage object from the pipeline's counts (text and speech tokens generated)."""
    text = int(pipeline_usage.get("thinker_tokens", 0))
    audio = int(pipeline_usage.get("speech_tokens", 0))
    prompt = int(pipeline_usage.get("prompt_tokens", 0))
    return {
        "total_tokens": prompt + text + audio,
        "input_tokens": prompt,
        "output_tokens": text + audio,
        "output_token_details": {"text_tokens": text, "audio_tokens": audio},
    }
