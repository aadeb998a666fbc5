"""The routes of a server with call workers (agent/calls/workers.py).

The front's (`front_router`, ahead of the plain routes): a WebRTC offer goes to the least
loaded worker that admits it (one answering 503 `server_busy` or `too_many_calls` passes it to
the next; all of them: 503 `server_busy` with Retry-After; an offer resuming a dropped call
goes on to the next while a worker does not know its token); the call's later requests (DELETE,
`hangup`, its sideband WebSocket) go to the worker that holds it. A Realtime call over the
WebSocket is placed and relayed likewise (agent/calls/worker_sockets.py). A call's record is read
here: every process writes the one database.
/metrics adds the workers' (each labelled `call_worker`).

A worker's own (`worker_router`, on its private socket, for the front only): its live calls,
the versions served now, to attach to, and a stage given up for good, for its calls to hear.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import httpx
from fastapi import APIRouter, Request, Response, WebSocket
from prometheus_client import CONTENT_TYPE_LATEST

from agent.calls.registry import tell_stage_failed
from agent.calls.signalling import (
    BUSY_RETRY_AFTER_S,
    NEGOTIATION_TIMEOUT_S,
    RESUME_HEADER,
    json_error,
    read_body,
    refusal,
    refuse,
)
from agent.calls.worker_sockets import realtime_call, sideband
from agent.calls.workers import FULL, CallWorker, CallWorkers
from agent.ops.metrics_merge import merged
from agent.serving.attached import follow

log = logging.getLogger(__name__)
front_router = APIRouter()
worker_router = APIRouter()

PASSED_ON = ("content-type", RESUME_HEADER.lower())  # what an offer keeps of its headers
ANSWERED = ("content-type", "location", "retry-after")  # what its answer keeps of the worker's
RESUME_UNKNOWN = "resume_expired"  # a worker that never held the dropped call says this


def _answer(response: httpx.Response) -> Response:
    headers = {k: v for k, v in response.headers.items() if k.lower() in ANSWERED}
    return Response(content=response.content, status_code=response.status_code,
                    headers=headers)


def _code(response: httpx.Response) -> str | None:
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return str(response.json()["error"]["code"])
    return None


@front_router.post("/v1/realtime/calls", status_code=201)
async def create_call(request: Request) -> Response:
    """Hand the offer to the least loaded worker that takes it."""
    state = request.app.state
    workers: CallWorkers = state.call_workers
    refused = refusal(state.readiness)
    if refused is not None:
        return refuse(request, refused.status, refused.code, refused.message, **refused.headers)
    body = await read_body(request, state.settings.max_sdp_bytes)
    if body is None:
        return json_error(413, "sdp_too_large",
                          f"offer exceeds {state.settings.max_sdp_bytes} bytes")
    headers = {k: v for k, v in request.headers.items() if k.lower() in PASSED_ON}
    unknown: httpx.Response | None = None  # a resume token the workers asked so far lack
    for worker in workers.by_load():
        response = await _offer(workers, worker, body, headers)
        if response is None or (response.status_code == 503 and _code(response) in FULL):
            continue
        if response.status_code == 410 and _code(response) == RESUME_UNKNOWN:
            unknown = response  # the dropped call may have lived on another worker
            continue
        if response.status_code == 201:
            call_id = response.headers.get("location", "").rsplit("/", 1)[-1]
            workers.routed(worker, call_id)
            log.info("call %s on call worker %d", call_id, worker.index)
        return _answer(response)
    if unknown is not None:
        return _answer(unknown)
    return refuse(request, 503, "server_busy", "server busy: every call worker is full",
                  **{"Retry-After": str(BUSY_RETRY_AFTER_S)})


async def _offer(workers: CallWorkers, worker: CallWorker, body: bytes,
                 headers: dict[str, str]) -> httpx.Response | None:
    """The worker's answer to the offer; None when it could not be asked (it is dying)."""
    assert worker.http is not None
    try:
        await workers.synced(worker)
        return await worker.http.post("/v1/realtime/calls", content=body, headers=headers,
                                      timeout=NEGOTIATION_TIMEOUT_S + 5.0)
    except httpx.HTTPError as exc:
        log.warning("call worker %d did not take an offer: %r", worker.index, exc)
        return None


@front_router.delete("/v1/realtime/calls/{call_id}", status_code=204)
@front_router.post("/v1/realtime/calls/{call_id}/hangup", status_code=204)
async def hang_up(call_id: str, request: Request) -> Response:
    """End a call: asked of the worker that holds it."""
    worker = request.app.state.call_workers.worker_of(call_id)
    if worker is None or worker.http is None:
        return json_error(404, "call_not_found", f"no call {call_id!r}")
    try:
        response = await worker.http.request(request.method, request.url.path)
    except httpx.HTTPError:
        return json_error(404, "call_not_found", f"no call {call_id!r} (its worker died)")
    return _answer(response)


@front_router.websocket("/v1/realtime")
async def realtime_or_sideband(websocket: WebSocket) -> None:
    """A Realtime call over the WebSocket goes to the least loaded worker that admits it; a
    call's sideband to the worker that holds the call (agent/calls/worker_sockets.py)."""
    call_id = websocket.query_params.get("call_id")
    if call_id is None:
        await realtime_call(websocket)
    else:
        await sideband(websocket, call_id)


@worker_router.get("/v1/worker/calls")
async def worker_calls(request: Request) -> dict[str, Any]:
    """The live calls of this worker (the front prunes its routes with it)."""
    return {"calls": [call.id for call in request.app.state.calls]}


@worker_router.post("/v1/worker/stage-failed", status_code=204)
async def worker_stage_failed(request: Request) -> Response:
    """The front's pipeline gave a stage up for good: this worker's calls hear it."""
    failed = await request.json()
    tell_stage_failed(request.app.state.calls, str(failed["stage"]), str(failed["reason"]))
    return Response(status_code=204)


@worker_router.put("/v1/worker/versions", status_code=204)
async def worker_versions(request: Request) -> Response:
    """Serve what the front serves now: attach to versions new here."""
    await follow(request.app.state.models, await request.json(),
                 request.app.state.pool_owner)
    return Response(status_code=204)


@front_router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """The front's metrics with its workers' (labelled `call_worker`): the calls' pacing,
    drops and refusals happen in the workers."""
    workers: CallWorkers = request.app.state.call_workers
    texts: dict[str, str] = {}
    for worker in workers.by_load():
        assert worker.http is not None
        with contextlib.suppress(httpx.HTTPError):
            texts[str(worker.index)] = (await worker.http.get("/metrics")).text
    own = request.app.state.metrics.exposition()
    return Response(merged(own, texts), media_type=CONTENT_TYPE_LATEST)
