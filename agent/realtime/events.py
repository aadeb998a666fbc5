"""Client events in from the `oai-events` data channel, checked against the `openai` package's
pydantic models so omnivox accepts what OpenAI's SDKs send (server events: server_events.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any, get_args

from openai.types.realtime import RealtimeClientEvent
from pydantic import BaseModel, ValidationError

from agent.realtime.server_events import error_event


@dataclass(frozen=True)
class ClientEventError(Exception):
    """A client event that could not be accepted; carries what the error event needs."""

    code: str
    message: str
    event_id: str | None = None

    def to_event(self) -> dict[str, Any]:
        return error_event(self.message, code=self.code, event_id=self.event_id)


@cache
def client_event_models() -> dict[str, type[BaseModel]]:
    """Each client event type name -> its model (the union's `type` literal)."""
    models = get_args(get_args(RealtimeClientEvent)[0])
    return {get_args(m.model_fields["type"].annotation)[0]: m for m in models}


def parse_client_event(raw: str | bytes, max_bytes: int) -> BaseModel:
    """Decode and validate one client event; raise ClientEventError saying what is wrong."""
    # A text message's size is its UTF-8 length (what crossed the wire), not its characters.
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise ClientEventError("message_too_large", f"event of {size} bytes > {max_bytes}")
    try:
        # Binary messages must be UTF-8 too (RFC 8259): json.loads would also guess UTF-16/32
        # and let lone surrogates through.
        data = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ClientEventError("invalid_json", f"event is not valid JSON: {exc}") from None
    except RecursionError:  # "[[[[...": json's C parser recurses once per level
        raise ClientEventError("invalid_json", "event is nested too deeply") from None
    if not isinstance(data, dict):
        raise ClientEventError("invalid_event", "event must be a JSON object")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    event_type = data.get("type")
    model = client_event_models().get(event_type) if isinstance(event_type, str) else None
    if model is None:
        raise ClientEventError("unknown_event", f"unknown event type {event_type!r}", event_id)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "event"
        raise ClientEventError(
            "invalid_event", f"invalid {event_type}: {where}: {first['msg']}", event_id
        ) from None
