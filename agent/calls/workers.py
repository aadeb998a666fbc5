"""Call workers, the front's side: N processes (`omnivox call-worker`), each an app on its own
unix socket that holds its calls' WebRTC peers, VAD, sessions and pacing, all on the front's one
pipeline (each attaches to it: pipeline/turns/orchestrator.py `Pipeline.attach`, engines never
duplicated). The front keeps which call lives on which worker, how many each holds (polled),
and restarts a worker that dies: its calls are lost, and their records say so
(`call_worker_died`); the pool blocks it held are reclaimed; the other workers go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agent.config import Settings
from agent.ops.records import CallRecords
from agent.serving.registry import ModelRegistry, VersionState

log = logging.getLogger(__name__)

DIED = "call_worker_died"  # the end reason of the calls a dead worker held
OWNER_BASE = 64  # pool owner tags of call workers: 64 + index (stage workers hold 2, 3, 4)
POLL_S = 1.0  # how often each worker's live calls are asked for
START_TIMEOUT_S = 120.0  # a worker not answering /healthz by then is killed and started again
RESTART_DELAY_S = 1.0
STOP_TIMEOUT_S = 10.0  # after SIGTERM (its calls closed), then SIGKILL
WORKER_HOST = "worker"  # the Host of requests to a worker (its socket is the address)
FULL = ("server_busy", "too_many_calls")  # a worker refusing for want of room: try the next


@dataclass(eq=False)
class CallWorker:
    """One call-worker process, as the front sees it."""

    index: int
    socket: str
    process: asyncio.subprocess.Process | None = None
    up: bool = False  # started and answering; offers may go to it
    restarts: int = 0
    calls: dict[str, float] = field(default_factory=dict)  # its live calls -> when routed
    synced: str = ""  # the served versions it was last told of (JSON)
    http: httpx.AsyncClient | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one version sync at a time

    @property
    def owner(self) -> int:
        return OWNER_BASE + self.index

    @property
    def base_url(self) -> str:
        return f"http://{WORKER_HOST}"

    def status(self) -> dict[str, Any]:
        pid = self.process.pid if self.process is not None else None
        return {"index": self.index, "up": self.up, "pid": pid, "calls": len(self.calls),
                "restarts": self.restarts}


def versions_of(models: ModelRegistry) -> list[dict[str, Any]]:
    """The served versions a worker may put calls on, with where to attach to each."""
    served = []
    for version in models.versions():
        address = getattr(version.pipeline, "address", lambda: None)()
        if address is None or version.state not in (VersionState.SERVING,
                                                    VersionState.DRAINING):
            continue
        served.append({"name": version.name, "version": version.version,
                       "family": version.family, "models_dir": str(version.model.models_dir),
                       "default": models.is_default(version),
                       "shifted_percent": shifted_percent(models, version),
                       "address": dataclasses.asdict(address)})
    return served


def shifted_percent(models: ModelRegistry, version: Any) -> int:
    """The share of its name's unpinned new callers a red-black shift sends to `version` (0:
    none), so that the workers' calls are split as the front's would be."""
    split = models.shifted(version.name)
    return split.percent if split is not None and split.version == version.version else 0


class CallWorkers:
    """Start, route to, watch and restart the call workers."""

    def __init__(self, settings: Settings, records: CallRecords, models: ModelRegistry,
                 pools: Callable[[], list[Any]]) -> None:
        self.settings, self.records, self.models = settings, records, models
        self.pools = pools  # the pools of the served pipelines (a dead worker's blocks freed)
        self.dir = tempfile.mkdtemp(prefix="omnivox-calls-")  # private (0700): the sockets
        self.workers = [CallWorker(i, f"{self.dir}/worker-{i}.sock")
                        for i in range(settings.call_workers)]
        self._tasks: list[asyncio.Task[None]] = []
        self._telling: set[asyncio.Task[None]] = set()  # stage failures on their way
        self._stopping = False

    # -- lifetime ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every worker (in the background: they come up while the engines load)."""
        settings_file = Path(self.dir) / "settings.json"
        # The front authenticates; a worker, reached only through the front's private
        # directory, takes what the front forwards (no keys, no CORS: none in its settings).
        worker_settings = self.settings.model_copy(update={
            "api_keys": [], "cors_origins": [], "call_workers": 1})
        settings_file.write_text(worker_settings.model_dump_json())
        for worker in self.workers:
            self._tasks.append(asyncio.create_task(self._keep(worker, settings_file)))
        self._tasks.append(asyncio.create_task(self._poll()))

    async def stop(self) -> None:
        """Stop every worker (SIGTERM: each closes its calls and writes their records)."""
        self._stopping = True
        for worker in self.workers:
            if worker.process is not None and worker.process.returncode is None:
                worker.process.send_signal(signal.SIGTERM)
        await asyncio.gather(*(self._reap(w) for w in self.workers))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for worker in self.workers:
            if worker.http is not None:
                await worker.http.aclose()
        shutil.rmtree(self.dir, ignore_errors=True)

    async def _reap(self, worker: CallWorker) -> None:
        process = worker.process
        if process is None:
            return
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            log.warning("call worker %d did not stop in %.0f s: killed", worker.index,
                        STOP_TIMEOUT_S)
            process.kill()
            await process.wait()

    async def _keep(self, worker: CallWorker, settings_file: Path) -> None:
        """Run `worker` for as long as the front runs, starting it again whenever it dies."""
        while not self._stopping:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(worker.socket)
            worker.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agent.cli", "call-worker", "--socket", worker.socket,
                "--settings-file", str(settings_file), "--owner", str(worker.owner),
                "--index", str(worker.index), stdin=asyncio.subprocess.DEVNULL,
                # Its own session: a terminal's Ctrl+C reaches the front alone, which stops
                # the workers in order (a worker that saw it too would count as dead).
                start_new_session=True)
            worker.http = worker.http or httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=worker.socket),
                base_url=worker.base_url, timeout=30.0)
            worker.synced = ""
            if await self._started(worker):
                worker.up = True
                log.info("call worker %d up (pid %d)", worker.index, worker.process.pid)
            code = await worker.process.wait()
            worker.up = False
            if self._stopping:
                return
            self._died(worker, code)
            worker.restarts += 1
            await asyncio.sleep(RESTART_DELAY_S)

    async def _started(self, worker: CallWorker) -> bool:
        """Wait for the worker's /healthz; False (and the worker killed) if it never came."""
        assert worker.process is not None and worker.http is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while worker.process.returncode is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if (await worker.http.get("/healthz")).status_code == 200:
                    return True
            await asyncio.sleep(0.2)
        if worker.process.returncode is None:
            log.error("call worker %d did not answer in %.0f s: killed", worker.index,
                      START_TIMEOUT_S)
            worker.process.kill()
        return False

    def _died(self, worker: CallWorker, code: int) -> None:
        """A worker died: its calls are gone (records say so), its pool blocks freed."""
        lost = list(worker.calls)
        worker.calls.clear()
        for call_id in lost:
            self.records.call_ended(call_id, DIED)
        freed = sum(pool.reclaim(worker.owner) for pool in self.pools())
        log.error("call worker %d (pid %s) died (exit %s): its %d call(s) ended %s (%s), "
                  "%d pool block(s) freed; starting it again", worker.index,
                  worker.process.pid if worker.process else "?", code, len(lost),
                  DIED, ", ".join(lost) or "none", freed)

    async def _poll(self) -> None:
        """Keep each worker's live calls current (calls end on their own in the workers)."""
        while True:
            await asyncio.sleep(POLL_S)
            await asyncio.gather(*(self._poll_one(w) for w in self.workers if w.up),
                                 return_exceptions=True)

    async def _poll_one(self, worker: CallWorker) -> None:
        assert worker.http is not None
        sent = time.monotonic()
        response = await worker.http.get("/v1/worker/calls")
        if response.status_code != 200:
            return
        live = set(response.json()["calls"])
        # A call routed while the question was out is not in the answer yet: kept.
        worker.calls = {c: t for c, t in worker.calls.items() if c in live or t >= sent}
        worker.calls.update({c: sent for c in live if c not in worker.calls})

    # -- routing -------------------------------------------------------------------------

    def by_load(self) -> list[CallWorker]:
        """The workers that take offers, least loaded first."""
        return sorted((w for w in self.workers if w.up), key=lambda w: len(w.calls))

    def worker_of(self, call_id: str) -> CallWorker | None:
        for worker in self.workers:
            if call_id in worker.calls:
                return worker
        return None

    def routed(self, worker: CallWorker, call_id: str) -> None:
        worker.calls[call_id] = time.monotonic()

    async def synced(self, worker: CallWorker) -> None:
        """Tell `worker` the versions served now (and where to attach), when they changed."""
        assert worker.http is not None
        served = json.dumps(versions_of(self.models), sort_keys=True)
        async with worker.lock:
            if served != worker.synced:
                response = await worker.http.put(
                    "/v1/worker/versions", content=served,
                    headers={"content-type": "application/json"}, timeout=60.0)
                response.raise_for_status()
                worker.synced = served

    def announce(self, stage: str, reason: str) -> None:
        """A stage was given up for good: every worker tells its live calls (a listener of
        the pipeline's, on the event loop)."""
        for worker in self.by_load():
            task = asyncio.create_task(self._tell(worker, stage, reason))
            self._telling.add(task)
            task.add_done_callback(self._telling.discard)

    async def _tell(self, worker: CallWorker, stage: str, reason: str) -> None:
        assert worker.http is not None
        try:
            await worker.http.post("/v1/worker/stage-failed",
                                   json={"stage": stage, "reason": reason})
        except httpx.HTTPError as exc:
            log.warning("call worker %d did not hear that %s failed: %r", worker.index,
                        stage, exc)

    def live(self) -> int:
        return sum(len(w.calls) for w in self.workers)

    def status(self) -> list[dict[str, Any]]:
        return [w.status() for w in self.workers]


async def exit_with_front(interval_s: float = 1.0) -> None:
    """In a call worker: stop (SIGTERM to itself: its calls closed) once its front is gone, so
    that a front killed outright leaves no worker behind."""
    front = os.getppid()
    while os.getppid() == front:
        await asyncio.sleep(interval_s)
    log.error("the front (pid %d) is gone: this call worker stops", front)
    os.kill(os.getpid(), signal.SIGTERM)
