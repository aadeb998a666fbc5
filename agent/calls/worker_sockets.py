"""The front's WebSockets to its call workers (agent/calls/workers.py): a Realtime call over the
WebSocket (`GET /v1/realtime?model=...`) goes to the least loaded worker that admits it, as a
WebRTC offer does; a call's sideband (`?call_id=`) to the worker that holds the call. Either is
then relayed both ways to the worker's own `/v1/realtime` over its unix socket.

The front has already authenticated the client (workers have no keys), so only what the call
itself needs goes on: the query (model, voice...) and the `realtime` subprotocol, never a key.
A Realtime call counts on its worker from its first event (`session.created` names it), so that
/readyz and the next call's routing see it at once; its record is the worker's, as an offer's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import httpx
from fastapi import Response, WebSocket
from websockets.asyncio.client import ClientConnection, unix_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

from agent.calls.model_pin import UnknownModelError, pinned_factory, websocket_model
from agent.calls.realtime_ws import REALTIME_SUBPROTOCOL
from agent.calls.signalling import (
    BUSY_RETRY_AFTER_S,
    NEGOTIATION_TIMEOUT_S,
    json_error,
    refusal,
)
from agent.calls.workers import FULL, WORKER_HOST, CallWorker, CallWorkers
from agent.ops import logs

log = logging.getLogger(__name__)

OPEN_TIMEOUT_S = NEGOTIATION_TIMEOUT_S + 5.0  # a worker's handshake and first event, at most
NO_STATUS = 1005  # the worker closed without a code: a plain close (1005 may not be sent)
NO_CLOSE_FRAME = 1006  # the worker's socket went away without closing: it died
WORKER_GONE = 1011  # what the client is told then (1006 may not be sent)


async def realtime_call(websocket: WebSocket) -> None:
    """Place a Realtime call on the least loaded worker that admits it; refused as the front
    alone would refuse it (model, readiness) or, when every worker is full, 503 server_busy."""
    if await _refused_here(websocket):
        return
    workers: CallWorkers = websocket.app.state.call_workers
    offered = websocket.scope.get("subprotocols", [])
    protocols = [Subprotocol(REALTIME_SUBPROTOCOL)] if REALTIME_SUBPROTOCOL in offered else []
    path = f"/v1/realtime?{websocket.url.query}"
    for worker in workers.by_load():
        placed = await _place(workers, worker, path, protocols)
        if placed is None:
            continue
        if isinstance(placed, Response):  # the worker refused for another reason: say so
            await websocket.send_denial_response(placed)
            return
        upstream, first = placed
        try:
            await websocket.accept(upstream.subprotocol)
            await websocket.send_text(first)
        except BaseException:  # the client left meanwhile: its call on the worker ends too
            await upstream.close()
            raise
        await relay(websocket, upstream)
        return
    await _refuse(websocket, 503, "server_busy", "server busy: every call worker is full",
                  **{"Retry-After": str(BUSY_RETRY_AFTER_S)})


async def _refused_here(websocket: WebSocket) -> bool:
    """Refuse, as realtime_ws.py does without workers, a model not served or a front not
    ready (draining, a stage down, no worker up): True when refused."""
    app = websocket.app
    try:
        pinned_factory(app, websocket_model(app, websocket.query_params.get("model")))
    except UnknownModelError as exc:
        await websocket.send_denial_response(json_error(404, "model_not_found", str(exc)))
        return True
    refused = refusal(app.state.readiness)
    if refused is not None:
        await _refuse(websocket, refused.status, refused.code, refused.message,
                      **refused.headers)
    return refused is not None


async def _place(workers: CallWorkers, worker: CallWorker, path: str,
                 protocols: list[Subprotocol]) -> tuple[ClientConnection, str] | Response | None:
    """The call opened on `worker` and its first event; the worker's refusal, unless it was
    for want of room; None when it is full or could not be asked (it is dying)."""
    try:
        await workers.synced(worker)  # the versions the call may pin, known there first
        upstream = await unix_connect(
            worker.socket, f"ws://{WORKER_HOST}{path}", subprotocols=protocols or None,
            # No deflate on the local hop: it would only cost both processes CPU.
            max_size=None, compression=None, open_timeout=OPEN_TIMEOUT_S)
    except InvalidStatus as exc:
        response = exc.response
        if response.status_code == 503 and _code(response.body) in FULL:
            return None
        kept = {k: v for k, v in response.headers.items() if k.lower() == "retry-after"}
        return Response(response.body, response.status_code, headers=kept,
                        media_type=response.headers.get("content-type"))
    except (OSError, TimeoutError, InvalidHandshake, httpx.HTTPError) as exc:
        log.warning("call worker %d did not take a WebSocket call: %r", worker.index, exc)
        return None
    try:
        first = await asyncio.wait_for(upstream.recv(decode=True), OPEN_TIMEOUT_S)
    except (ConnectionClosed, TimeoutError) as exc:
        log.warning("call worker %d closed a WebSocket call before it began: %r",
                    worker.index, exc)
        await upstream.close()
        return None
    call_id = _session_id(str(first))
    if call_id is not None:  # counted now; the poll would only see it within a second
        workers.routed(worker, call_id)
        logs.bind_call(call_id)
        log.info("call %s (a WebSocket) on call worker %d", call_id, worker.index)
    return upstream, str(first)


async def sideband(websocket: WebSocket, call_id: str) -> None:
    """Relay a call's sideband to the worker that holds the call."""
    worker = websocket.app.state.call_workers.worker_of(call_id)
    if worker is None:
        await websocket.send_denial_response(
            json_error(404, "call_not_found", f"no call {call_id!r}"))
        return
    try:
        upstream = await unix_connect(
            worker.socket, f"ws://{WORKER_HOST}/v1/realtime?call_id={call_id}",
            max_size=None)
    except InvalidStatus as exc:  # the worker refused (the call ended meanwhile): say so
        await websocket.send_denial_response(Response(
            exc.response.body, exc.response.status_code,
            media_type=exc.response.headers.get("content-type")))
        return
    except OSError:
        await websocket.send_denial_response(
            json_error(404, "call_not_found", f"no call {call_id!r} (its worker died)"))
        return
    await websocket.accept()
    await relay(websocket, upstream)


async def relay(client: WebSocket, upstream: ClientConnection) -> None:
    """Pass messages both ways until either side closes; then close the other, the client
    with the worker's own close (a limit's 1008 stays 1008), or 1011 when the worker died."""

    async def down() -> None:
        async for message in upstream:
            if isinstance(message, str):
                await client.send_text(message)
            else:
                await client.send_bytes(message)

    async def up() -> None:
        while True:
            received = await client.receive()
            if received["type"] == "websocket.disconnect":
                return
            if received.get("text") is not None:
                await upstream.send(received["text"])
            elif received.get("bytes") is not None:
                await upstream.send(received["bytes"])

    tasks = [asyncio.create_task(down()), asyncio.create_task(up())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()
        code, reason = _close_of(upstream)
        with contextlib.suppress(RuntimeError, ConnectionClosed):
            await client.close(code, reason)


def _close_of(upstream: ClientConnection) -> tuple[int, str]:
    """The close to pass on to the client for how the worker's side ended."""
    code = upstream.close_code
    if code is None or code == NO_CLOSE_FRAME:
        return WORKER_GONE, "the call worker died"
    if code == NO_STATUS:
        return 1000, ""
    return code, upstream.close_reason or ""


def _code(body: bytes | bytearray | None) -> str:
    """The OpenAI error code of a refusal's body ("" when it has none)."""
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return str(json.loads(bytes(body or b""))["error"]["code"])
    return ""


def _session_id(event: str) -> str | None:
    """The call's id, from its `session.created` (None for any other event)."""
    with contextlib.suppress(ValueError, KeyError, TypeError):
        parsed = json.loads(event)
        if parsed["type"] == "session.created":
            return str(parsed["session"]["id"])
    return None


async def _refuse(websocket: WebSocket, status: int, code: str, message: str, **headers: str
                  ) -> None:
    """Refuse the handshake as a call offer is refused: counted, then OpenAI's error body."""
    websocket.app.state.metrics.calls_refused.labels(code).inc()
    await websocket.send_denial_response(json_error(status, code, message, **headers))
