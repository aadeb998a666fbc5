"""WebRTC signalling in the shape of OpenAI's Realtime API: POST an SDP offer, get the answer."""

from __future__ import annotations

import asyncio
import logging
from typing import NamedTuple

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from agent.calls.model_pin import UnknownModelError, pinned_factory
from agent.calls.offer import MULTIPART, SDP, OfferError, read_offer
from agent.calls.readiness import Readiness
from agent.calls.registry import CallLimitError, CallRegistry
from agent.calls.resume import ResumeError
from agent.openai_errors import openai_error
from agent.ops import logs
from agent.realtime.session_config import SessionConfigError

log = logging.getLogger(__name__)
router = APIRouter()

NEGOTIATION_TIMEOUT_S = 10.0
RESUME_HEADER = "Omnivox-Resume-Token"  # a dropped call's token: go on with its conversation
BUSY_RETRY_AFTER_S = 2  # the admission window is a few seconds: load is measured anew by then


def json_error(status: int, code: str, message: str, **headers: str) -> JSONResponse:
    """The body every refused request gets: OpenAI's error shape."""
    body = {"error": {"type": "invalid_request_error", "code": code, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers or None)


async def read_body(request: Request, limit: int) -> bytes | None:
    """The request body, or None as soon as it grows past `limit` (never read unbounded)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


class Refusal(NamedTuple):
    """Why the server takes no call now: an HTTP status, OpenAI's error code and message."""

    status: int
    code: str
    message: str
    headers: dict[str, str]


def refusal(readiness: Readiness) -> Refusal | None:
    """Why the server takes no new call (a WebRTC offer or a WebSocket) now, or None."""
    if readiness.draining:  # told to stop: the caller should retry, on another server
        return Refusal(503, "server_draining", readiness.summary(), {"Retry-After": "2"})
    if not readiness.stages_ready():
        if readiness.failed():  # given up for good: no Retry-After, an operator must act
            return Refusal(503, "stage_failed", readiness.summary(), {})
        return Refusal(503, "not_ready", readiness.summary(), {"Retry-After": "5"})
    busy = readiness.full()
    if busy is not None:  # one more call would slow every live one: the caller retries
        return Refusal(503, "server_busy", f"server busy: {busy}",
                       {"Retry-After": str(BUSY_RETRY_AFTER_S)})
    return None


def refuse(request: Request, status: int, code: str, message: str, **headers: str
           ) -> JSONResponse:
    """A call offer refused for want of room, readiness or time: counted, then answered."""
    request.app.state.metrics.calls_refused.labels(code).inc()
    return json_error(status, code, message, **headers)


def call_location(prefix: str, call_id: str) -> str:
    """The call's path for its later requests; `prefix` routes them to this server when
    several sit behind one address (docs/operations.md, Deployment)."""
    return f"{prefix}/v1/realtime/calls/{call_id}"


@router.post("/v1/realtime/calls", status_code=201)
async def create_call(request: Request) -> Response:
    """Answer a caller's SDP offer and start the call."""
    settings = request.app.state.settings
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() not in (SDP, MULTIPART):
        return json_error(415, "unsupported_media_type",
                          f"send the offer as {SDP}, or as {MULTIPART} with sdp and session")
    body = await read_body(request, settings.max_sdp_bytes)
    if body is None:
        return json_error(413, "sdp_too_large", f"offer exceeds {settings.max_sdp_bytes} bytes")
    try:
        offer = read_offer(content_type, body)
    except OfferError as exc:
        return json_error(exc.status, exc.code, exc.message)
    try:  # the model version the call's session pins (else its name's default)
        factory = pinned_factory(request.app, offer.session.model if offer.session else None)
    except UnknownModelError as exc:
        return json_error(404, "model_not_found", f"session: model: {exc}")
    refused = refusal(request.app.state.readiness)
    if refused is not None:
        return refuse(request, refused.status, refused.code, refused.message, **refused.headers)
    calls: CallRegistry = request.app.state.calls
    resumed = None
    token = request.headers.get(RESUME_HEADER)
    if token is not None:
        try:  # before the new call: a dropped call still held frees its place
            resumed = await calls.take_over(token.strip())
        except ResumeError as exc:
            return json_error(410, "resume_expired", str(exc))
    try:
        call = calls.new_call()
    except CallLimitError as exc:
        return refuse(request, 503, "too_many_calls", str(exc), **{"Retry-After": "5"})
    request.app.state.admission.taken()
    logs.bind_call(call.id)  # this request, and every task the call starts from here
    if resumed is not None:
        log.info("call %s resumes a dropped call's conversation", call.id)
    try:
        answer = await asyncio.wait_for(
            call.answer(offer.sdp, factory, offer.session, resumed),
            NEGOTIATION_TIMEOUT_S,
        )
    except SessionConfigError as exc:  # a value refused, or a voice its model does not speak
        await call.close("invalid_session")
        return openai_error(400, "invalid_session", f"session: {exc}", param=exc.param)
    except TimeoutError:
        await call.close()
        return refuse(request, 504, "negotiation_timeout", "could not build an answer in time")
    except Exception as exc:  # aiortc refuses offers it cannot negotiate in many ways
        await call.close()
        log.info("offer refused: %s", exc)
        return json_error(400, "invalid_sdp", f"cannot negotiate this offer: {exc}")
    request.app.state.metrics.calls_started.inc()
    log.info("call %s started (%d live)", call.id, len(calls))
    return Response(
        content=answer,
        status_code=201,
        media_type="application/sdp",
        headers={"Location": call_location(settings.location_prefix, call.id)},
    )


@router.delete("/v1/realtime/calls/{call_id}", status_code=204)
@router.post("/v1/realtime/calls/{call_id}/hangup", status_code=204)
async def hang_up(call_id: str, request: Request) -> Response:
    """End a call (DELETE, or the `hangup` action as OpenAI's SDK sends it)."""
    call = request.app.state.calls.get(call_id)
    if call is None:
        return json_error(404, "call_not_found", f"no call {call_id!r}")
    await call.close()
    return Response(status_code=204)
