"""The supervisor (in the API process): starts the stage workers, watches, restarts them.

Each stage has one slot and one watcher task. A watcher spawns its worker (`spawn` context),
waits for `Ready` (or `StartFailed`, an exit, or the start timeout), then watches the running
worker through its process sentinel and its heartbeats. When a worker dies, hangs, says it is
`Broken` (alive, but its engine died) or is found stuck by its clients (`replace`: no output
for any request for the stall timeout): its in-flight requests are failed (`on_lost`), its whole
process group is killed (no orphaned engine processes), its pool blocks are reclaimed, and
after a back-off a new one is started. A worker silent past the heartbeat timeout is hung
unless the kernel says it was waiting for a CPU (starved: `schedstat`); a starved one is given
up to `starved_grace_s` more before it is replaced.
`max_attempts` failed starts in a row, or as many workers lost after a good start with no
request served in between (a crash loop), mark the stage failed, with the reason, and
`on_failed` tells the pipeline's owner (a failed stage is never restarted: calls must hear of it).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import enum
import logging
import multiprocessing
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.process import BaseProcess
from typing import Any

import zmq
import zmq.asyncio

from pipeline.runtime import schedstat
from pipeline.runtime.messages import Broken, Heartbeat, Ready, StartFailed, control_decoder
from pipeline.runtime.worker import WorkerSpec, worker_main
from pipeline.settings import RestartPolicy
from pipeline.tensors.shm import BlockPool

logger = logging.getLogger(__name__)

_SPAWN = multiprocessing.get_context("spawn")
_LATE_REASON_S = 0.5  # after an exit at start, how long StartFailed may still be on its way
_EXIT_STATUS_WAIT_S = 2.0  # after the sentinel closes, how long the exit status may take


class StageState(enum.StrEnum):
    """Where a stage stands, for readiness checks."""

    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class StageStatus:
    """One stage's state as /readyz reports it."""

    stage: str
    state: StageState
    reason: str = ""
    restarts: int = 0
    pid: int | None = None
    active: int = 0  # jobs in flight, from the last heartbeat
    served: int = 0  # jobs the current worker has served, from its heartbeats


class _Slot:
    """One stage's worker: the current process and what the watcher knows of it."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.status = StageStatus(spec.stage, StageState.STARTING)
        self.process: BaseProcess | None = None
        self.exited: asyncio.Future[None] | None = None  # of the current process
        self.started: asyncio.Future[Ready | StartFailed] | None = None
        self.last_beat = 0.0
        self.quiet_since: schedstat.SchedSample | None = None  # at the last beat, or verdict
        self.broken: str | None = None  # the running worker can serve no more: why
        self.woken = asyncio.Event()  # set with `broken`: its watch acts at once
        self.settled = asyncio.Event()  # ready or failed: start() waits for this

    def mark_broken(self, reason: str) -> None:
        """The running worker can serve no more: its watch replaces it now, not at its next
        poll (a dead engine's turns fail at once; the calls' next turns wait for the new one)."""
        self.broken = reason
        self.woken.set()

    def update(self, **changes: Any) -> None:
        self.status = replace(self.status, **changes)


class Supervisor:
    """Owns the stage worker processes of one pipeline."""

    def __init__(self, specs: list[WorkerSpec], policy: RestartPolicy, control_endpoint: str,
                 pool: BlockPool, on_lost: Callable[[str, str], None],
                 on_failed: Callable[[str, str], None] | None = None) -> None:
        self.policy, self.control_endpoint = policy, control_endpoint
        self.pool, self.on_lost, self.on_failed = pool, on_lost, on_failed
        self._slots = {spec.stage: _Slot(spec) for spec in specs}
        self._ctx = zmq.asyncio.Context.instance()
        self._control: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        atexit.register(self._kill_all)  # runs before multiprocessing joins its children

    async def start(self) -> None:
        """Start every worker; return once each stage is ready or has failed."""
        control = self._ctx.socket(zmq.PULL)
        control.setsockopt(zmq.LINGER, 0)
        control.bind(self.control_endpoint)
        self._control = control
        self._tasks = [asyncio.create_task(self._read_control(control))]
        self._tasks += [asyncio.create_task(self._watch(slot)) for slot in self._slots.values()]
        await asyncio.gather(*(slot.settled.wait() for slot in self._slots.values()))

    def status(self) -> dict[str, StageStatus]:
        """Every stage's current state."""
        return {name: slot.status for name, slot in self._slots.items()}

    async def stop(self) -> None:
        """Stop every worker: SIGTERM, then SIGKILL to its group past the stop timeout."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        live = [slot for slot in self._slots.values() if slot.process is not None]
        for slot in live:
            pid = slot.process.pid if slot.process is not None else None
            if pid is not None:  # always, for a started process
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        await asyncio.gather(*(self._bury(slot, self.policy.stop_timeout_s) for slot in live))
        for slot in self._slots.values():
            slot.update(state=StageState.STOPPED, pid=None)
        if self._control is not None:
            self._control.close()
        atexit.unregister(self._kill_all)

    def replace(self, stage: str, reason: str) -> None:
        """Replace the stage's running worker, which lives but cannot serve (as `Broken`)."""
        slot = self._slots[stage]
        if slot.status.state == StageState.READY and slot.broken is None:
            slot.mark_broken(reason)

    async def _watch(self, slot: _Slot) -> None:
        """Keep one stage's worker running, restarting it with back-off.

        Two counts in a row give a stage up at `max_attempts`: failed starts (reset by a good
        start), and workers lost after a good start (reset by a lost worker that had served a
        request): a worker that starts and then dies, or hangs, before serving anything would
        otherwise be restarted for ever. Either count doubles the back-off.
        """
        failures = losses = 0
        while True:
            reason = await self._start_worker(slot)
            if reason is None:  # ready
                failures = 0
                slot.update(state=StageState.READY, reason="")
                slot.settled.set()
                reason = await self._until_lost(slot)
                losses = 1 if slot.status.served else losses + 1
                strikes, what = losses, "lost with no request served in between"
            else:
                failures += 1
                strikes, what = failures, "failed starts in a row"
            logger.error("stage %s: %s", slot.spec.stage, reason)
            slot.update(state=StageState.RESTARTING, reason=reason, active=0)
            self.on_lost(slot.spec.stage, reason)
            await self._bury(slot, 0.0)
            if strikes >= self.policy.max_attempts:
                self._fail(slot, f"{reason} ({strikes} {what})")
                return
            slot.update(pid=None, restarts=slot.status.restarts + 1)
            backoff = min(self.policy.backoff_s * 2 ** (strikes - 1), self.policy.backoff_max_s)
            logger.info("stage %s: restart %d in %.2f s", slot.spec.stage, slot.status.restarts,
                        backoff)
            await asyncio.sleep(backoff)

    def _fail(self, slot: _Slot, reason: str) -> None:
        """Give the stage up: it stays failed, and the pipeline's owner hears of it."""
        logger.error("stage %s given up: %s", slot.spec.stage, reason)
        slot.update(state=StageState.FAILED, pid=None, reason=reason)
        slot.settled.set()
        if self.on_failed is not None:
            self.on_failed(slot.spec.stage, reason)

    async def _start_worker(self, slot: _Slot) -> str | None:
        """Spawn the worker and wait until it is ready; None, or why it did not start."""
        loop = asyncio.get_running_loop()
        started: asyncio.Future[Ready | StartFailed] = loop.create_future()
        slot.started = started
        spec = replace(slot.spec, parent_pid=os.getpid())
        process = _SPAWN.Process(target=worker_main, args=(spec,), name=f"omnivox-{spec.stage}")
        process.start()  # a few ms: fork/exec and a small pickle; the import runs in the child
        exited = _exit_future(process)
        slot.process, slot.exited, slot.last_beat = process, exited, loop.time()
        slot.broken, slot.quiet_since = None, None
        slot.woken.clear()
        slot.update(pid=process.pid, served=0)
        waiters: list[asyncio.Future[Any]] = [started, exited]
        done, _ = await asyncio.wait(waiters, timeout=self.policy.start_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if started in done and isinstance(started.result(), Ready):
            return None
        if not done:
            return f"not ready within {self.policy.start_timeout_s:g} s"
        await _wait(started, _LATE_REASON_S)  # the reason may trail the exit a little
        # A Ready that trails the exit has no reason to give: the exit status says it.
        if started.done() and isinstance(failed := started.result(), StartFailed):
            return f"failed to start: {failed.reason}"
        return f"failed to start: {await _exit_reason(process)}"

    async def _until_lost(self, slot: _Slot) -> str:
        """Watch a ready worker until it exits or stops beating; why it was lost."""
        loop = asyncio.get_running_loop()
        process, exited = slot.process, slot.exited
        # _start_worker set both for this worker; only its burial, after this, clears them.
        assert process is not None and exited is not None
        while True:
            began = loop.time()
            await _wait_either(exited, slot.woken, self.policy.heartbeat_s)
            if exited.done():
                return await _exit_reason(process)
            if slot.broken is not None:
                return f"{slot.broken}; worker replaced"
            if loop.time() - began > self.policy.heartbeat_timeout_s:
                # This loop was held up itself (a blocking caller, a suspended process): the
                # beats sent meanwhile are queued unread, so the silence is ours, not the
                # worker's. Its silence counts from now (a hung worker is found one timeout
                # later), whichever of this task and the beats' reader runs first.
                logger.warning("stage %s: the supervisor's loop was held up %.1f s; the "
                               "worker's silence counts from now", slot.spec.stage,
                               loop.time() - began)
                slot.last_beat = max(slot.last_beat, loop.time())
                if slot.status.pid is not None:
                    slot.quiet_since = schedstat.sample(slot.status.pid)
                continue
            silent = loop.time() - slot.last_beat
            if silent > self.policy.heartbeat_timeout_s:
                hung = self._judge_silence(slot, silent)
                if hung is not None:
                    return hung

    def _judge_silence(self, slot: _Slot, silent: float) -> str | None:
        """Why a worker silent past the heartbeat timeout is lost, or None while it is only
        starved of CPU (within the grace). Judged on each heartbeat timeout's worth of
        silence in turn: a worker that stops waiting for a CPU is hung from then on."""
        policy, pid = self.policy, slot.status.pid
        now = schedstat.sample(pid) if pid is not None else None
        start = slot.quiet_since
        if now is None or start is None:  # no figures here: silence alone decides
            return f"no heartbeat for {silent:.1f} s (hung); killed"
        past_grace = silent > policy.heartbeat_timeout_s + policy.starved_grace_s
        if not past_grace and now.at - start.at < policy.heartbeat_timeout_s:
            return None  # starved at the last verdict; this window is not over yet
        silence = schedstat.judge(start, now)
        if silence.verdict == schedstat.Verdict.HUNG:
            return f"no heartbeat for {silent:.1f} s, hung ({silence}); killed"
        if past_grace:
            return (f"no heartbeat for {silent:.1f} s, starved of CPU past the "
                    f"{policy.starved_grace_s:g} s grace ({silence}); killed")
        logger.warning("stage %s: no heartbeat for %.1f s, but starved of CPU, not hung (%s): "
                       "left running, up to %g s of silence", slot.spec.stage, silent, silence,
                       policy.heartbeat_timeout_s + policy.starved_grace_s)
        slot.quiet_since = now
        return None

    async def _bury(self, slot: _Slot, grace_s: float) -> None:
        """Make sure the worker and its whole group are gone; reclaim the blocks it held."""
        process, exited = slot.process, slot.exited
        if process is None or exited is None:
            return
        await _wait(exited, grace_s)
        assert process.pid is not None  # a started process has one
        _kill_group(process.pid)  # engine children outlive their worker unless killed here
        await exited
        process.join()
        process.close()
        slot.process = slot.exited = None  # only now: a burial cut short is finished by stop()
        self.pool.reclaim(slot.spec.owner)  # logs what it freed

    async def _read_control(self, control: zmq.asyncio.Socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            payload = await control.recv()
            try:
                msg = control_decoder.decode(payload)
            except Exception as exc:
                logger.error("undecodable control message dropped: %s", exc)
                continue
            slot = self._slots.get(msg.stage)
            if slot is None or slot.status.pid != msg.pid:
                continue  # from a worker already replaced
            slot.last_beat = loop.time()  # Ready counts too: the start may outlast the timeout
            slot.quiet_since = schedstat.sample(msg.pid)  # where a silence would start
            if isinstance(msg, Heartbeat):
                if (msg.active, msg.served) != (slot.status.active, slot.status.served):
                    slot.update(active=msg.active, served=msg.served)
            elif isinstance(msg, Broken):
                slot.mark_broken(msg.reason)
            elif slot.started is not None and not slot.started.done():
                slot.started.set_result(msg)

    def _kill_all(self) -> None:
        """Last resort at interpreter exit: no worker group may outlive the API process."""
        for slot in self._slots.values():
            if slot.process is not None and slot.process.pid is not None:
                _kill_group(slot.process.pid)


async def _wait(fut: asyncio.Future[Any], timeout: float) -> None:
    """Wait up to `timeout` for `fut` without cancelling it (and without wait_for, which in
    3.11 can swallow the caller's own cancellation)."""
    await asyncio.wait([fut], timeout=timeout)


async def _wait_either(fut: asyncio.Future[Any], event: asyncio.Event, timeout: float) -> None:
    """Wait up to `timeout` for `fut` (never cancelled here) or `event`, whichever comes first."""
    woken = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait([fut, woken], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        woken.cancel()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _exit_future(process: BaseProcess) -> asyncio.Future[None]:
    """A future done when `process` exits (its sentinel becomes readable)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    fd = process.sentinel

    def on_exit() -> None:
        loop.remove_reader(fd)
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, on_exit)
    return fut


async def _exit_reason(process: BaseProcess) -> str:
    """How the worker ended. Its sentinel closes while the kernel is still tearing it down,
    a moment before the exit status can be collected (tens of ms for a worker with a big
    engine): wait for the status, without blocking the loop, rather than report none."""
    deadline = asyncio.get_running_loop().time() + _EXIT_STATUS_WAIT_S
    while process.exitcode is None and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    code = process.exitcode
    if code is None:
        return "worker ended (its exit status did not come)"
    if code < 0:
        return f"worker killed by {signal.Signals(-code).name}"
    return f"worker exited with code {code}"
