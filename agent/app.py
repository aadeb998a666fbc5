"""The FastAPI application: health, signalling and the web page, in one async worker."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from agent.api import auth
from agent.api.records_route import router as records_router
from agent.api.signalling import router as signalling_router
from agent.calls.call import Call, HandlerFactory
from agent.calls.registry import CallRegistry, announce_stage_failures
from agent.config import Settings
from agent.ops.metrics import Metrics
from agent.ops.metrics import router as metrics_router
from agent.ops.readiness import Readiness
from agent.ops.records import CallRecords
from agent.realtime.session import Session

log = logging.getLogger(__name__)


def create_app(
    settings: Settings,
    *,
    pipeline: Any | None = None,
    handler_factory: HandlerFactory | None = None,
) -> FastAPI:
    """Build the app; `pipeline` (when given) is started in the background at startup so the
    API answers /healthz at once while the engines load. Calls are handled by a conversation
    `Session` on that pipeline unless `handler_factory` says otherwise (tests)."""
    if handler_factory is None and pipeline is not None:

        def handler_factory(call: Call) -> Session:
            return Session(call, pipeline, settings.conversation)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Records first: a data directory that cannot be written stops the start, saying why.
        await asyncio.to_thread(app.state.records.open)
        # Everything imported and built so far lives as long as the process: keep it out of
        # the collector, whose full passes over it stalled the event loop (and /healthz, and
        # every call's pacing) for 90-160 ms each. Garbage first, so none is frozen with it.
        gc.collect()
        gc.freeze()
        starting = asyncio.create_task(pipeline.start()) if pipeline is not None else None
        loop_lag = asyncio.create_task(app.state.metrics.loop_lag_monitor.run())
        try:
            yield
        finally:
            loop_lag.cancel()
            await app.state.calls.close_all()
            await asyncio.to_thread(app.state.records.close)  # the calls' end rows written
            if starting is not None:
                starting.cancel()
                with contextlib.suppress(BaseException):
                    await starting
                await pipeline.stop()

    app = FastAPI(title="omnivox", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = metrics = Metrics()
    app.state.records = records = CallRecords(settings.data_dir)
    app.state.calls = CallRegistry(settings, metrics, records)
    metrics.track(lambda: len(app.state.calls), pipeline)
    app.state.readiness = Readiness(pipeline)
    if pipeline is not None:  # a stage given up for good is announced on every live call
        announce_stage_failures(pipeline, app.state.calls)
    app.state.pipeline = pipeline
    app.state.handler_factory = handler_factory

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """The API process is alive."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        """200 when every stage can take a call; else 503 naming the stage and why."""
        readiness: Readiness = request.app.state.readiness
        ready = readiness.ready()
        body = {
            "status": "ready" if ready else "not_ready",
            "detail": readiness.summary(),
            "stages": readiness.stages(),
            "calls": len(request.app.state.calls),
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    auth.install(app, settings)  # API keys, client secrets, CORS; before the page mount
    app.include_router(signalling_router)
    app.include_router(records_router)
    app.include_router(metrics_router)
    app.mount("/", StaticFiles(directory=settings.web_dir, html=True), name="web")
    return app
