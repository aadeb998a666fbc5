"""The body of `POST /v1/realtime/calls`: an SDP offer alone (`application/sdp`), or OpenAI's
server-side form (`multipart/form-data` with an `sdp` part and a JSON `session` part)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from openai.types.realtime import RealtimeSessionCreateRequest
from pydantic import ValidationError

from agent.form_data import MULTIPART, form_parts
from media.sdp import SdpError, check_offer

SDP = "application/sdp"


@dataclass(frozen=True)
class OfferError(Exception):
    """An offer refused before any call exists: 415 for the wrong type, else 400."""

    status: int
    code: str
    message: str


@dataclass(frozen=True)
class Offer:
    sdp: str
    session: RealtimeSessionCreateRequest | None  # the call's session from its first event


def read_offer(content_type: str, body: bytes) -> Offer:
    """The offer in `body`; OfferError saying what is wrong with it."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == SDP:
        return Offer(_sdp(body), None)
    if kind == MULTIPART:
        parts = form_parts(content_type, body)
        if parts is None:
            raise OfferError(400, "invalid_request", "the multipart form could not be read")
        if "sdp" not in parts:
            raise OfferError(400, "invalid_request", "the form has no 'sdp' part")
        session = _session(parts["session"]) if "session" in parts else None
        return Offer(_sdp(parts["sdp"]), session)
    raise OfferError(415, "unsupported_media_type",
                     f"send the offer as {SDP}, or as {MULTIPART} with 'sdp' and 'session' parts")


def _sdp(raw: bytes) -> str:
    try:
        offer = raw.decode("utf-8")
        check_offer(offer)
    except UnicodeDecodeError:
        raise OfferError(400, "invalid_sdp", "offer is not UTF-8 text") from None
    except SdpError as exc:
        raise OfferError(400, "invalid_sdp", str(exc)) from None
    return offer


def _session(raw: bytes) -> RealtimeSessionCreateRequest:
    """The `session` part, checked against OpenAI's own model of it."""
    try:
        data: Any = json.loads(raw.decode("utf-8"))
        return RealtimeSessionCreateRequest.model_validate(data)
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "session"
            message = f"session: {where}: {first['msg']}"
        else:
            message = f"session is not valid JSON: {exc}"
        raise OfferError(400, "invalid_session", message) from None
