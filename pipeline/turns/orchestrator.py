"""The `Pipeline`: the agent's one handle on the model stages (lives in the API process).

It owns the shared block pool (created at start, unlinked at stop), the supervisor of the
stage workers, one `StageClient` per stage, and the registry of turns in flight:
`respond(turn)` runs a turn and streams its events, `cancel(turn_id)` stops one, `health()`
answers readiness checks and `on_stage_failed(listener)` hears of a stage given up for good.

Another process (a call worker, agent/calls/workers.py) uses the same running pipeline through
`Pipeline.attach(pipeline.address(), owner)`: its own clients on the same stage workers and the
same pool under its own owner tag, no supervisor (the process that started it keeps that).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.errors import PipelineBusyError, PipelineNotRunningError, StageFailedError
from pipeline.models import ensure_models
from pipeline.runtime.client import StageClient
from pipeline.runtime.messages import InspectReply
from pipeline.runtime.supervisor import StageState, StageStatus, Supervisor
from pipeline.runtime.worker import WorkerSpec
from pipeline.settings import STAGE_ORDER, TENSOR_CONSUMERS, PipelineSettings
from pipeline.stage import ThinkerJob, ThinkerOutput
from pipeline.tensors.shm import BlockPool
from pipeline.turns.events import Event, Turn, TurnDone, TurnFailed
from pipeline.turns.text_generation import generate_text
from pipeline.turns.turn import TurnRun

logger = logging.getLogger(__name__)

API_OWNER = 1  # the pool owner tag of the API process; workers get 2, 3, 4
WARM_UP = "warm-up"  # the warm-up turns' call id, and their entry among the stages' states
WARM_UP_TOKENS = 8  # of each warm-up turn's reply: enough for a first chunk of speech


@dataclass(frozen=True)
class PipelineAddress:
    """What another process needs to use a running pipeline: its stage workers' sockets (in
    `runtime_dir`), its pool's name and its settings (JSON)."""

    runtime_dir: str
    pool_name: str
    settings: dict[str, Any]


@dataclass(frozen=True)
class PipelineHealth:
    """Readiness: every stage ready, and each stage's state with its reason."""

    ready: bool
    stages: dict[str, StageStatus]


class Pipeline:
    """Thinker -> Talker -> VoiceBox stage workers behind one async API."""

    def __init__(self, settings: PipelineSettings | dict[str, Any]) -> None:
        if not isinstance(settings, PipelineSettings):
            settings = PipelineSettings.model_validate(settings)
        self.settings = settings
        self.pool: BlockPool | None = None
        self._dir: str | None = None
        self._supervisor: Supervisor | None = None
        self._clients: dict[str, StageClient] = {}
        self._runs: dict[str, TurnRun] = {}
        self._starting = False
        self._warming = False  # the warm-up turns run: not ready yet (health())
        self._attached = False  # a view of a pipeline another process runs (attach())
        self._failure_listeners: list[Callable[[str, str], None]] = []

    def address(self) -> PipelineAddress | None:
        """Where another process attaches to this pipeline while it runs; None before."""
        if self._dir is None or self.pool is None or not self._clients:
            return None
        return PipelineAddress(self._dir, self.pool.name, self.settings.model_dump(mode="json"))

    @classmethod
    async def attach(cls, address: PipelineAddress, owner: int) -> Pipeline:
        """A view of the pipeline at `address` that another process runs: turns, cancels and
        text requests go to its stage workers; the pool blocks this one holds carry `owner`
        (unique among the pool's users: the starting process reclaims them if this one dies).
        It never starts, restarts or stops workers; a stage is ready while its connection is."""
        view = cls(PipelineSettings.model_validate(address.settings))
        view._attached, view._dir = True, address.runtime_dir
        view.pool = await asyncio.to_thread(BlockPool.attach, address.pool_name, owner)
        view._connect_clients([view._spec(stage, owner, address.pool_name)
                               for stage in STAGE_ORDER])
        async with asyncio.timeout(view.settings.connect_timeout_s):
            await asyncio.gather(*(c.wait_connected() for c in view._clients.values()))
        return view

    async def start(self) -> None:
        """Build missing models, create the pool, start the workers; wait until each stage is
        ready or failed (see `health()`)."""
        if self._supervisor is not None:
            raise RuntimeError("pipeline already started")
        self._starting = True
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise
        finally:
            self._starting = False

    async def _start(self) -> None:
        s = self.settings
        if s.build_models:
            await ensure_models(s.family, s.version, s.model_path)
        self._dir = tempfile.mkdtemp(prefix="omnivox-")  # private (0700): our ipc sockets
        name = f"omnivox-{os.getpid()}-{secrets.token_hex(4)}"
        self.pool = pool = await asyncio.to_thread(BlockPool.create, name, s.pool.block_count,
                                                   s.pool.block_size, owner=API_OWNER)
        specs = [self._spec(stage, API_OWNER + 1 + i, pool.name)
                 for i, stage in enumerate(STAGE_ORDER)]
        self._connect_clients(specs)
        self._supervisor = Supervisor(specs, s.restart, f"ipc://{self._dir}/control.sock",
                                      self.pool, on_lost=self._on_stage_lost,
                                      on_failed=self._on_stage_failed)
        await self._supervisor.start()
        health = self._stage_health()
        ready = [st for st, status in health.stages.items() if status.state == StageState.READY]
        await asyncio.gather(*(self._clients[st].wait_connected() for st in ready))
        if not health.ready:
            logger.error("pipeline started with stages not ready: %s", health.stages)
        elif s.warm_up is not None:
            await self._warm_up(s.warm_up)

    async def _warm_up(self, system_prompt: str) -> None:
        """Hear a second of silence and answer a greeting under `system_prompt`, so that the
        engines hold that prompt's prefix and every part has run once; until then the pipeline
        is not ready. A turn that fails is logged: the callers' turns will say more."""
        began = asyncio.get_running_loop().time()
        messages = [{"role": "system", "content": system_prompt},
                    {"role": "user", "content": "Hello."}]
        self._warming = True
        try:
            for turn in (Turn("warm-up-hearing", messages[:1], audio=np.zeros(16_000, np.int16),
                              max_tokens=WARM_UP_TOKENS, call_id=WARM_UP),
                         Turn("warm-up-reply", messages, max_tokens=WARM_UP_TOKENS,
                              call_id=WARM_UP)):
                async for event in self.respond(turn):
                    if isinstance(event, TurnFailed):
                        logger.warning("warm-up turn %s failed: %s", turn.turn_id, event.error)
        finally:
            self._warming = False
        logger.info("pipeline warmed up in %.1f s", asyncio.get_running_loop().time() - began)

    def _connect_clients(self, specs: list[WorkerSpec]) -> None:
        s = self.settings
        assert self.pool is not None
        for spec in specs:
            client = StageClient(spec.stage, spec.endpoint, self.pool, queue_size=s.request_queue,
                                 abort_timeout_s=s.abort_timeout_s,
                                 connect_timeout_s=s.connect_timeout_s,
                                 stall_timeout_s=s.stall_timeout_s,
                                 on_stuck=self._on_stage_stuck)
            client.connect()
            self._clients[spec.stage] = client

    async def stop(self) -> None:
        """Cancel every turn, stop the workers, unlink the pool (an attached view only closes
        its clients and its mapping of the pool)."""
        await asyncio.gather(*(run.cancel() for run in list(self._runs.values())))
        if self._supervisor is not None:
            await self._supervisor.stop()
        for client in self._clients.values():
            await client.close()
        self._supervisor, self._clients = None, {}
        if self.pool is not None:
            self.pool.close()
            if not self._attached:
                self.pool.unlink()
            self.pool = None
        if self._dir is not None and not self._attached:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    async def __aenter__(self) -> Pipeline:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def runtime_dir(self) -> str | None:
        """The pipeline's private directory (its sockets, its engines'), while it runs."""
        return self._dir

    def health(self) -> PipelineHealth:
        """Each stage's state (starting, ready, restarting, failed) and reason; until start()
        returns (its clients connect, the warm-up turns run) a `warm-up` entry says the stages
        ready are not yet serving (/readyz names it)."""
        health = self._stage_health()
        if not (self._starting and health.ready):
            return health
        reason = "the warm-up turns run" if self._warming else "connecting to the stages"
        warming = StageStatus(WARM_UP, StageState.STARTING, reason)
        return PipelineHealth(False, {**health.stages, WARM_UP: warming})

    def _stage_health(self) -> PipelineHealth:
        """The stages' own states: what a turn needs to run."""
        if self._attached:  # what this process sees: the connection to each stage worker
            return _connections(self._clients)
        if self._supervisor is None:  # not started, or still building models / the pool
            state = StageState.STARTING if self._starting else StageState.STOPPED
            return PipelineHealth(False, {st: StageStatus(st, state) for st in STAGE_ORDER})
        stages = self._supervisor.status()
        return PipelineHealth(all(st.state == StageState.READY for st in stages.values()), stages)

    async def respond(self, turn: Turn, *, overlap: bool | None = None) -> AsyncIterator[Event]:
        """Run one turn; its events, ending with TurnDone or TurnFailed (or nothing more once
        cancelled). Leaving the iteration early cancels the turn. `overlap` overrides the
        profile's cascade setting for this turn (benchmarks compare the two)."""
        run = self._admit(turn, self.settings.cascade.overlap if overlap is None else overlap)
        if isinstance(run, TurnFailed):
            yield run
            return
        try:
            while True:
                event = await run.events.get()
                if event is None or run.cancelled:
                    return
                yield event
                if isinstance(event, (TurnDone, TurnFailed)):
                    return
        finally:
            if not run.cancelled and run.task is not None and not run.task.done():
                await run.cancel()
            del self._runs[turn.turn_id]

    def generate_text(self, job: ThinkerJob) -> AsyncIterator[ThinkerOutput]:
        """A text-only Thinker request (text_generation.py) beside the calls' turns, in the
        same engine; raises StageFailedError at once while the Thinker is not ready."""
        if not self._running() or self.pool is None:
            raise PipelineNotRunningError("the pipeline is not running (start() it first)")
        status = self.health().stages["thinker"]
        if status.state != StageState.READY:
            reason = f"{status.state}: {status.reason}" if status.reason else status.state
            raise StageFailedError("thinker", reason)
        return generate_text(self._clients["thinker"], self.pool, job)

    async def cancel(self, turn_id: str) -> bool:
        """Abort every request of the turn in its engine and drop its VoiceBox jobs; no event
        of the turn follows. False if no such turn was in flight."""
        run = self._runs.get(turn_id)
        if run is None or run.cancelled:
            return False
        await run.cancel()
        return True

    async def active_requests(self) -> dict[str, InspectReply]:
        """Per ready stage: the request ids its engine and its worker still hold."""
        ready = [st for st, status in self._stage_health().stages.items()
                 if status.state == StageState.READY]
        replies = await asyncio.gather(*(self._clients[st].inspect() for st in ready))
        return dict(zip(ready, replies, strict=True))

    def _admit(self, turn: Turn, overlap: bool) -> TurnRun | TurnFailed:
        """Register and start the turn's run, or say why it cannot run."""
        if not self._running() or self.pool is None:
            raise PipelineNotRunningError("the pipeline is not running (start() it first)")
        if turn.turn_id in self._runs:
            raise ValueError(f"turn {turn.turn_id} is already in flight")
        for status in self._stage_health().stages.values():  # the warm-up's turns run too
            if status.state != StageState.READY:
                reason = f"{status.state}: {status.reason}" if status.reason else status.state
                return TurnFailed(turn.turn_id, StageFailedError(status.stage, reason))
        if len(self._runs) >= self.settings.max_turns:
            return TurnFailed(turn.turn_id, PipelineBusyError(
                f"{self.settings.max_turns} turns already in flight"))
        run = TurnRun(turn, self._clients, self.pool, self.settings, overlap)
        self._runs[turn.turn_id] = run
        run.start()
        return run

    def _running(self) -> bool:
        return self._supervisor is not None or (self._attached and bool(self._clients))

    def on_stage_failed(self, listener: Callable[[str, str], None]) -> None:
        """Call `listener(stage, reason)` (on the event loop) when a stage is marked failed:
        its worker could not be started `max_attempts` times in a row and will not be retried,
        so every turn fails from then on. The agent uses it to tell its live calls."""
        self._failure_listeners.append(listener)

    def _on_stage_stuck(self, stage: str, reason: str) -> None:
        if self._supervisor is not None:
            self._supervisor.replace(stage, reason)

    def _on_stage_lost(self, stage: str, reason: str) -> None:
        self._clients[stage].fail_pending(reason)

    def _on_stage_failed(self, stage: str, reason: str) -> None:
        for listener in self._failure_listeners:
            try:
                listener(stage, reason)
            except Exception:  # one broken listener must not silence the others
                logger.exception("stage-failure listener %r failed", listener)

    def _spec(self, stage: str, owner: int, pool_name: str) -> WorkerSpec:
        s = self.settings
        return WorkerSpec(
            stage=stage, family=s.family, endpoint=f"ipc://{self._dir}/{stage}.sock",
            control_endpoint=f"ipc://{self._dir}/control.sock", pool_name=pool_name,
            owner=owner, settings=s.stages.get(stage, {}), models_dir=str(s.version.root),
            heartbeat_s=s.restart.heartbeat_s,
            stop_timeout_s=s.restart.stop_timeout_s, log_level=s.log_level,
            nice=s.nice[stage], cuda_ipc=s.cuda_ipc and stage in TENSOR_CONSUMERS,
            runtime_dir=self._dir or "")


def _connections(clients: dict[str, StageClient]) -> PipelineHealth:
    """An attached view's health: a stage is ready while its worker is connected."""
    stages = {st: StageStatus(st, StageState.READY if client.connected
                              else StageState.RESTARTING, "" if client.connected
                              else "not connected to its worker")
              for st, client in clients.items()}
    return PipelineHealth(bool(stages) and all(s.state == StageState.READY
                                               for s in stages.values()), stages)
