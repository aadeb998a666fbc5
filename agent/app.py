"""The FastAPI application: health, signalling and the web page, in one async worker, and the
server that runs it and drains it on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.config import STARTUP_FAILURE

from agent.api import auth
from agent.api.chat_completions import router as chat_completions_router
from agent.api.completion_slots import CompletionSlots
from agent.api.models_route import router as models_router
from agent.api.records_route import router as records_router
from agent.api.rollout_route import router as rollout_router
from agent.api.served_models import served_version
from agent.api.speech import router as speech_router
from agent.api.transcription import router as transcription_router
from agent.api.version_route import router as version_router
from agent.api.version_route import versions
from agent.calls.admission import Admission, AdmissionLimits
from agent.calls.call import Call, HandlerFactory
from agent.calls.readiness import Readiness
from agent.calls.realtime_ws import router as realtime_ws_router
from agent.calls.registry import CallRegistry, announce_stage_failures
from agent.calls.signalling import router as signalling_router
from agent.calls.workers import CallWorkers, exit_with_front
from agent.calls.workers_route import front_router, worker_router
from agent.config import Settings
from agent.ops.metrics import Metrics
from agent.ops.metrics import router as metrics_router
from agent.ops.records import CallRecords
from agent.profiles import with_profile_aliases
from agent.realtime.session import Session
from agent.serving.attached import detach_all
from agent.serving.binding import call_pipeline
from agent.serving.registry import ModelRegistry
from agent.serving.rollout import Rollouts
from agent.serving.rollout_metrics import RolloutCollector
from media.rnnoise_internals import RnnoiseInternalsError
from media.rnnoise_internals import library as rnnoise_library

log = logging.getLogger(__name__)


def create_app(
    settings: Settings,
    *,
    pipeline: Any | None = None,
    handler_factory: HandlerFactory | None = None,
    owns_pipeline: bool = True,
) -> FastAPI:
    """Build the app; `pipeline` (when given) is started in the background at startup so the
    API answers /healthz at once while the engines load, and stopped at shutdown, unless the
    app does not own it (`owns_pipeline` false: a pipeline another app started, shared by
    tests that differ only in API settings). Calls are handled by a conversation `Session` on
    that pipeline unless `handler_factory` says otherwise (tests)."""
    settings = with_profile_aliases(settings)
    models = ModelRegistry(settings.profile)
    first = served_version(settings, pipeline, owns_pipeline)
    if first is not None:
        models.add(first, default=True)
    if handler_factory is None and pipeline is not None:

        def handler_factory(call: Call, model_id: str | None = None) -> Session:
            """A conversation on the version the call's session pins, else the default."""
            return Session(call, call_pipeline(models, model_id, pipeline), call.conversation)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Records first: a data directory that cannot be written stops the start, saying why.
        await asyncio.to_thread(app.state.records.open)
        await load_noise_suppressor()
        # A rollout the last process left half-done: rolled back (this one serves the old);
        # the versions it left serving beside the default serve again.
        await asyncio.to_thread(app.state.rollouts.recover)
        app.state.rollouts.restore()
        # Everything imported and built so far lives as long as the process: keep it out of
        # the collector, whose full passes over it stalled the event loop (and /healthz, and
        # every call's pacing) for 90-160 ms each. Garbage first, so none is frozen with it.
        gc.collect()
        gc.freeze()
        starting = (asyncio.create_task(pipeline.start())
                    if pipeline is not None and owns_pipeline else None)
        if starting is not None:
            starting.add_done_callback(lambda task: _start_failed(
                task, app.state.readiness, lambda: first is None or models.is_default(first)))
        loop_lag = asyncio.create_task(app.state.metrics.loop_lag_monitor.run())
        load = asyncio.create_task(app.state.admission.run())
        if workers is not None:
            await workers.start()
        try:
            yield
        finally:
            loop_lag.cancel()
            load.cancel()
            if workers is not None:
                await workers.stop()  # each closes its calls and writes their records
            await app.state.calls.close_all()
            await app.state.rollouts.close()  # the versions a rollout started stop with the app
            await asyncio.to_thread(app.state.records.close)  # the calls' end rows written
            if starting is not None and pipeline is not None:
                starting.cancel()
                with contextlib.suppress(BaseException):
                    await starting
                await pipeline.stop()

    app = FastAPI(title="omnivox", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = metrics = Metrics()
    app.state.records = records = CallRecords(settings.data_dir)
    app.state.calls = CallRegistry(settings, metrics, records)
    # What the app checks of its pipeline (readiness, metrics, failures) follows the default
    # version's (agent/serving/registry.py), whichever a rollout made it.
    serving = models if first is not None else pipeline
    app.state.models = models
    app.state.rollouts = Rollouts(models, settings)
    metrics.registry.register(RolloutCollector(models, app.state.rollouts))
    metrics.track(lambda: len(app.state.calls), serving)
    app.state.admission = admission_of(settings, metrics)
    app.state.readiness = Readiness(serving, app.state.admission)
    # Call workers (agent/calls/workers.py): past 1, the WebRTC calls live in their processes.
    workers = (CallWorkers(settings, records, models, lambda: _pools(models))
               if settings.call_workers > 1 and pipeline is not None else None)
    app.state.call_workers = workers
    if workers is not None:
        app.state.readiness.call_plane = lambda: (
            None if workers.by_load() else "no call worker is up yet")
    if serving is not None:  # a stage given up for good is announced on every live call
        announce_stage_failures(serving, app.state.calls)
        if workers is not None:  # the workers' calls too
            serving.on_stage_failed(workers.announce)
    app.state.pipeline = pipeline
    app.state.completion_slots = CompletionSlots(settings.max_completions_in_flight)
    app.state.handler_factory = handler_factory

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """The API process is alive."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        """200 when every stage can take a call; else 503 naming the stage and why, or saying
        that the server is draining."""
        readiness: Readiness = request.app.state.readiness
        ready = readiness.ready()
        body = {
            "status": readiness.status(),
            "detail": readiness.summary(),
            "stages": readiness.stages(),
            "calls": live_calls(request.app),
            "versions": versions(request.app),
        }
        if workers is not None:
            body["call_workers"] = workers.status()
        return JSONResponse(body, status_code=200 if ready else 503)

    auth.install(app, settings)  # API keys, client secrets, CORS; before the page mount
    if settings.location_prefix:  # added last, so outermost: authentication sees /v1/...
        app.add_middleware(StripPrefix, prefix=settings.location_prefix)
    if workers is not None:  # ahead of the plain routes: calls go to the workers
        app.include_router(front_router)
    app.include_router(signalling_router)
    app.include_router(realtime_ws_router)
    app.include_router(records_router)
    app.include_router(rollout_router)  # before models_router: /v1/models/rollout is no id
    app.include_router(models_router)
    app.include_router(version_router)
    app.include_router(chat_completions_router)
    app.include_router(speech_router)
    app.include_router(transcription_router)
    app.include_router(metrics_router)
    app.mount("/", StaticFiles(directory=settings.web_dir, html=True), name="web")
    return app


def admission_of(settings: Settings, metrics: Metrics) -> Admission:
    """Admission control from the settings, on this process's event loop."""
    return Admission(AdmissionLimits(
        max_loop_lag_s=settings.admission_max_loop_lag_ms / 1e3,
        max_cpu_wait=settings.admission_max_cpu_wait, window_s=settings.admission_window_s,
        max_pacing_late_s=settings.admission_max_pacing_late_ms / 1e3,
        max_starting=settings.admission_max_starting,
    ), metrics.loop_lag_monitor)


def live_calls(app: FastAPI) -> int:
    """Calls live in this process and in its call workers."""
    workers: CallWorkers | None = getattr(app.state, "call_workers", None)
    return len(app.state.calls) + (workers.live() if workers is not None else 0)


def _pools(models: ModelRegistry) -> list[Any]:
    return [v.pipeline.pool for v in models.versions()
            if getattr(v.pipeline, "pool", None) is not None]


async def load_noise_suppressor() -> None:
    """Import RNNoise off the event loop at start (a quarter of a second), so the first call to
    turn noise reduction on stalls no call's pacing; a broken install is logged here, and such
    a session.update refused with its reason."""
    try:
        await asyncio.to_thread(rnnoise_library)
    except RnnoiseInternalsError as exc:
        log.warning("noise reduction is unavailable: %s", exc)


def create_worker_app(settings: Settings, pool_owner: int) -> FastAPI:
    """A call worker's app (agent/calls/workers.py): WebRTC calls and their sidebands, on
    views of the front's pipelines (the front says which: /v1/worker/versions), their pool
    blocks tagged `pool_owner`. No rollouts, no page, no keys: only the front reaches it."""
    settings = with_profile_aliases(settings)
    models = ModelRegistry(settings.profile)

    def handler_factory(call: Call, model_id: str | None = None) -> Session:
        return Session(call, call_pipeline(models, model_id, None), call.conversation)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(app.state.records.open)
        await load_noise_suppressor()
        gc.collect()
        gc.freeze()  # as in create_app: no full collections over what lives as long as this
        loop_lag = asyncio.create_task(app.state.metrics.loop_lag_monitor.run())
        load = asyncio.create_task(app.state.admission.run())
        orphaned = asyncio.create_task(exit_with_front())
        try:
            yield
        finally:
            loop_lag.cancel()
            load.cancel()
            orphaned.cancel()
            await app.state.calls.close_all()
            await detach_all(models)
            await asyncio.to_thread(app.state.records.close)

    app = FastAPI(title="omnivox call worker", lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = metrics = Metrics()
    app.state.records = records = CallRecords(settings.data_dir)
    app.state.calls = CallRegistry(settings, metrics, records)
    app.state.models = models
    app.state.pool_owner = pool_owner
    app.state.admission = admission_of(settings, metrics)
    app.state.readiness = Readiness(None, app.state.admission)  # the front checks the stages
    app.state.handler_factory = handler_factory
    metrics.track(lambda: len(app.state.calls), None)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    app.include_router(worker_router)
    app.include_router(signalling_router)
    app.include_router(realtime_ws_router)
    app.include_router(metrics_router)
    return app


def _start_failed(task: asyncio.Task[None], readiness: Readiness,
                  applies: Callable[[], bool]) -> None:
    """Readiness hears why the pipeline's start gave up (its error says why, in one line), for
    as long as that pipeline serves the default (`applies`: a rollout may replace it)."""
    if not task.cancelled() and task.exception() is not None:
        readiness.start_failed(str(task.exception()), applies)


class StripPrefix:
    """ASGI middleware: a request whose path starts with this server's `location_prefix` is
    served as if it had come without it (a router that does not strip the prefix, or a client
    reaching the server directly with a call's Location)."""

    def __init__(self, app: ASGIApp, prefix: str) -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] in ("http", "websocket") and path.startswith(self.prefix + "/"):
            scope = dict(scope, path=path[len(self.prefix):])
            raw = scope.get("raw_path")
            if isinstance(raw, bytes) and raw.startswith(self.prefix.encode() + b"/"):
                scope["raw_path"] = raw[len(self.prefix):]
        await self.app(scope, receive, send)


class DrainingServer(uvicorn.Server):
    """uvicorn's server that drains on SIGTERM: new calls are refused (503 `server_draining`)
    and /readyz says so while the live calls go on, until they have all ended or
    `drain_timeout_s` has passed; then it stops as uvicorn does (the app's shutdown closes the
    calls left, `server_shutdown`, and stops the workers). A second SIGTERM, or SIGINT at any
    time, stops at once."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.app = app
        self.drain_timeout_s = drain_timeout_s
        self.drain_deadline: float | None = None
        self._drain_announced = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self.drain_deadline is None and not self.should_exit:
            # Not recorded as a captured signal: uvicorn would raise it again after the stop.
            # Only flags here (a signal handler); the main loop's tick does the rest.
            self.drain_deadline = time.monotonic() + self.drain_timeout_s
            self.app.state.readiness.drain()
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and not self.should_exit:
            self.should_exit = self._drained()
        return await super().on_tick(counter)

    def _drained(self) -> bool:
        """Whether the drain is over: no call left, or the bound has passed."""
        live = live_calls(self.app)
        if not self._drain_announced:
            self._drain_announced = True
            log.info("SIGTERM: draining, %d live call(s), at most %.0f s; new calls refused",
                     live, self.drain_timeout_s)
        if live == 0:
            log.info("drained: no live call left, stopping")
            return True
        if time.monotonic() >= (self.drain_deadline or 0.0):
            log.warning("drain bound of %.0f s passed: closing %d live call(s)",
                        self.drain_timeout_s, live)
            return True
        return False


def run_server(app: FastAPI, settings: Settings) -> int:
    """Serve `app` in this process until it is told to stop (SIGTERM drains first); the exit
    status: 0, or uvicorn's startup failure (3: the port is taken, the app did not start)."""
    # One worker on purpose: the engines live once per host, behind this process.
    # log_config=None: uvicorn's records go through our handler, in the chosen format.
    config = uvicorn.Config(app, host=settings.host, port=settings.port, workers=1,
                            log_level=settings.log_level, log_config=None)
    server = DrainingServer(config, app, settings.drain_timeout_s)
    # uvicorn raises a stopping signal again once stopped, to the handler that was there before
    # its own: for a second SIGTERM, ours makes that a clean exit 0 rather than death by signal.
    signal.signal(signal.SIGTERM, lambda *_: None)
    # uvicorn raises SIGINT again once stopped; as uvicorn.run does, that ends the run quietly.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else STARTUP_FAILURE
