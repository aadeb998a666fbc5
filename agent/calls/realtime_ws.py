"""Realtime over WebSocket: `GET /v1/realtime?model=...`, as OpenAI's SDKs connect
(`client.realtime.connect(model=...)`), and `GET /v1/realtime?call_id=...`, the sideband of a
live call (`client.realtime.connect(call_id=...)`, API keys only). Who may connect is settled
before this route by the authentication middleware (agent/api/auth.py); a call it cannot take
is refused before the handshake completes, with the HTTP status and OpenAI's error body a call
offer would get."""

from __future__ import annotations

import logging

from fastapi import APIRouter, WebSocket

from agent.calls.model_pin import UnknownModelError, pinned_factory, websocket_model
from agent.calls.registry import CallLimitError, CallRegistry
from agent.calls.sideband import Sideband
from agent.calls.signalling import Refusal, json_error, refusal
from agent.calls.websocket_call import WebSocketCall
from agent.openai_errors import openai_error
from agent.ops import logs
from agent.realtime.session_config import SessionConfigError

log = logging.getLogger(__name__)
router = APIRouter()

REALTIME_SUBPROTOCOL = "realtime"  # what browsers offer beside their key


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket) -> None:
    """One conversation for as long as the socket is open, or the sideband of a call."""
    state = websocket.app.state
    call_id = websocket.query_params.get("call_id")
    if call_id is not None:
        await _sideband(websocket, state.calls, call_id)
        return
    asked = websocket_model(websocket.app, websocket.query_params.get("model"))
    try:
        factory = pinned_factory(websocket.app, asked)
    except UnknownModelError as exc:
        await _deny(websocket, 404, "model_not_found", str(exc))
        return
    refused = refusal(state.readiness)
    calls: CallRegistry = state.calls
    call: WebSocketCall | None = None
    if refused is None:
        try:
            call = calls.new_call(WebSocketCall)
            state.admission.taken()
        except CallLimitError as exc:
            refused = Refusal(503, "too_many_calls", str(exc), {"Retry-After": "5"})
    if call is None:
        assert refused is not None
        status, code, message, headers = refused
        state.metrics.calls_refused.labels(code).inc()
        await _deny(websocket, status, code, message, **headers)
        return
    logs.bind_call(call.id)
    try:  # the voice the call starts with, on the version it pins: as an offer's is checked
        call.start_handler(factory)
    except SessionConfigError as exc:
        await call.close("invalid_session")
        await websocket.send_denial_response(openai_error(400, "invalid_session",
                                                          f"session: {exc}", param=exc.param))
        return
    offered = websocket.scope.get("subprotocols", [])
    await websocket.accept(REALTIME_SUBPROTOCOL if REALTIME_SUBPROTOCOL in offered else None)
    state.metrics.calls_started.inc()
    log.info("call %s started over a WebSocket (%d live)", call.id, len(calls))
    try:
        await call.run(websocket)
    finally:
        await call.close()


async def _sideband(websocket: WebSocket, calls: CallRegistry, call_id: str) -> None:
    observed = calls.get(call_id)
    if observed is None or observed.closed:
        await _deny(websocket, 404, "call_not_found", f"no call {call_id!r}")
        return
    logs.bind_call(observed.id)
    await websocket.accept()
    log.info("call %s: a sideband joined", observed.id)
    await Sideband(observed, websocket).run()
    log.info("call %s: a sideband left", observed.id)


async def _deny(websocket: WebSocket, status: int, code: str, message: str, **headers: str
                ) -> None:
    """Refuse the handshake with an HTTP response (uvicorn's websocket denial extension)."""
    await websocket.send_denial_response(json_error(status, code, message, **headers))
