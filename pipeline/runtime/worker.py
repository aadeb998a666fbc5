"""A stage worker process: hosts one `Stage` and serves its jobs over a zmq ROUTER socket.

Started by the supervisor with the `spawn` context. The worker is its own process group (the
engine's child processes join it), titles itself `omnivox-<stage>`, attaches the shared pool
under its own owner tag, starts the stage, binds its socket, says `Ready` and then serves every
job as an independent task, heartbeating to the supervisor from its event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import setproctitle
import zmq
import zmq.asyncio

from pipeline import environment
from pipeline.runtime.messages import (
    Abort,
    Aborted,
    Broken,
    Heartbeat,
    Inspect,
    InspectReply,
    Ready,
    ReleaseTensors,
    RequestError,
    StartFailed,
    client_decoder,
    encode,
)
from pipeline.settings import RUNTIME_DIR_ENV
from pipeline.stage import Job, Output, Stage, StageContext, output_tensors
from pipeline.tensors.cuda_ipc import CudaIpcRef, cuda_allocated_bytes
from pipeline.tensors.shm import BlockPool, StaleBlockError

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_ABORT_WAIT_S = 1.0  # how long an abort waits for its jobs' tasks to unwind
# A job whose input was given back unread waits this long for its abort: a cancelled turn frees
# its jobs' blocks before their abort, sent right after, gets here; unaborted, it is a failure.
_STALE_INPUT_WAIT_S = 5.0


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs, pickled to it by `spawn`."""

    stage: str
    family: str
    endpoint: str  # ipc:// address this worker binds for jobs
    control_endpoint: str  # the supervisor's socket for Ready / Heartbeat / StartFailed
    pool_name: str
    owner: int  # this worker's tag in the pool (reclaimed when it dies)
    settings: dict[str, Any]
    models_dir: str
    parent_pid: int = 0  # set by the supervisor as it spawns the worker
    heartbeat_s: float = 0.5
    stop_timeout_s: float = 10.0
    max_jobs: int = 4096
    log_level: str = "INFO"
    nice: int = 10
    cuda_ipc: bool = False  # the stage reading this one's tensors maps CUDA ones by CUDA IPC
    # The pipeline's private directory, removed when it stops: where the stage's engine keeps
    # its sockets, so an engine killed mid-run leaves none behind in the system's temp dir.
    runtime_dir: str = ""


def load_stage_class(family: str, stage: str) -> type[Stage]:
    """The family's Stage class for `stage`: a family name, or a dotted module with STAGES."""
    stages: Mapping[str, type[Stage]]  # what a family's module declares (see families)
    if "." in family:
        stages = importlib.import_module(family).STAGES
    else:
        from pipeline.families import load_family

        stages = load_family(family).STAGES
    if stage not in stages:
        raise KeyError(f"family {family!r} has no stage {stage!r} (it has {sorted(stages)})")
    return stages[stage]


def worker_main(spec: WorkerSpec) -> None:
    """Process entry point of a stage worker."""
    os.setsid()  # own process group: the supervisor kills the whole group, engine children too
    _die_with_parent(spec.parent_pid)
    setproctitle.setproctitle(f"omnivox-{spec.stage}")
    if spec.runtime_dir:
        environment.put(RUNTIME_DIR_ENV, spec.runtime_dir)
    # Below the API process in CPU priority (engine children inherit it): the call plane's
    # 20 ms pacing must not starve behind batch compute when cores are few.
    _nice_autogroup(os.nice(spec.nice))
    logging.basicConfig(level=spec.log_level, format=f"%(asctime)s omnivox-{spec.stage} "
                                                     "%(levelname)s %(name)s: %(message)s")
    code = asyncio.run(_run(spec))
    # Everything of the stage is released by now; the interpreter's own teardown of a torch
    # heap would cost a second or two of CPU for nothing on every stop and restart.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _nice_autogroup(nice: int) -> None:
    """Lower this session's scheduling autogroup to `nice` as well. Where the kernel groups
    processes by session (sched_autogroup_enabled, the default on Debian and Ubuntu), CPU time
    is first shared between the groups, each at its own nice value; a process's own nice value
    only orders it within its group. After setsid() the worker leads a group of its own: without
    this its engines would compete with the API process as equals whatever os.nice() said."""
    path = "/proc/self/autogroup"
    if not os.path.exists(path):
        return  # no autogroups here: os.nice() is all there is
    for _ in range(20):  # unprivileged writers are held to one change per 100 ms, system-wide
        try:
            with open(path, "w") as autogroup:
                autogroup.write(str(nice))
            return
        except BlockingIOError:  # EAGAIN: another process changed one just now
            time.sleep(0.1)
        except OSError as exc:
            logger.warning("could not lower the scheduling autogroup: %s", exc)
            return
    logger.warning("could not lower the scheduling autogroup: busy")


def _kill_own_group(*_: object) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _die_with_parent(parent_pid: int) -> None:
    """When the API process dies, take this worker's whole group (engine children) down too."""
    signal.signal(signal.SIGHUP, _kill_own_group)  # after setsid no terminal ever sends SIGHUP
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGHUP, 0, 0, 0) != 0:
        logger.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    if os.getppid() != parent_pid:  # the parent died before the guard was armed
        _kill_own_group()


async def _run(spec: WorkerSpec) -> int:
    """Start the stage and serve until SIGTERM; the process exit code."""
    ctx = zmq.asyncio.Context()
    control = ctx.socket(zmq.PUSH)
    control.setsockopt(zmq.LINGER, 2000)  # StartFailed must reach the supervisor before exit
    control.connect(spec.control_endpoint)
    try:
        pool = BlockPool.attach(spec.pool_name, owner=spec.owner)
        stage = load_stage_class(spec.family, spec.stage)()
        stage_ctx = StageContext(pool, spec.settings, spec.models_dir, spec.stage, spec.cuda_ipc)
        await stage.start(stage_ctx)
    except Exception as exc:  # any start failure is reported, with its reason, then fatal
        logger.exception("stage %s failed to start", spec.stage)
        await control.send(encode(StartFailed(spec.stage, os.getpid(), _describe(exc))))
        control.close()
        ctx.term()
        return 1
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full or vanished client is an error, not a drop
    router.bind(spec.endpoint)
    server = JobServer(spec, stage, stage_ctx, router, control)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await control.send(encode(Ready(spec.stage, os.getpid())))
    logger.info("stage %s ready on %s", spec.stage, spec.endpoint)
    try:
        await server.serve(stop)
    finally:
        await server.shutdown()
        router.close()
        control.close(linger=0)
        ctx.term()
        pool.close()
    return 0


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class JobServer:
    """The worker's job loop: each job an independent task; abort, inspect, tensor releases
    and heartbeats. A job's CUDA IPC pieces are mapped as it arrives and dropped at its end."""

    def __init__(self, spec: WorkerSpec, stage: Stage, ctx: StageContext,
                 router: zmq.asyncio.Socket, control: zmq.asyncio.Socket) -> None:
        self.spec, self.stage, self.ctx = spec, stage, ctx
        self.router, self.control = router, control
        self.jobs: dict[str, asyncio.Task[None]] = {}
        self._chores: set[asyncio.Task[None]] = set()
        self._broken = False  # the stage's failure has been logged
        self.served = 0  # jobs that ended with a complete output (the supervisor's loss count)

    async def serve(self, stop: asyncio.Event) -> None:
        """Receive and dispatch messages until `stop` is set (or the receive loop breaks)."""
        loops = [asyncio.create_task(self._receive()), asyncio.create_task(self._heartbeat())]
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait([stopped, *loops], return_when=asyncio.FIRST_COMPLETED)
            for task in loops:
                if task.done():
                    task.result()  # a broken loop ends the worker: the supervisor restarts it
        finally:
            for pending in [stopped, *loops]:
                pending.cancel()

    async def _receive(self) -> None:
        while True:
            identity, payload = await self.router.recv_multipart()
            self._dispatch(identity, payload)

    async def shutdown(self) -> None:
        """Drop every job and stop the stage (bounded by the stop timeout)."""
        for task in [*self.jobs.values(), *self._chores]:
            task.cancel()
        try:
            async with asyncio.timeout(self.spec.stop_timeout_s):
                await self.stage.stop()
        except Exception:
            logger.exception("stage %s did not stop cleanly", self.spec.stage)

    def _dispatch(self, identity: bytes, payload: bytes) -> None:
        try:
            msg = client_decoder.decode(payload)
        except msgspec.DecodeError as exc:
            self._reject(identity, payload, exc)
            return
        if isinstance(msg, Abort):
            self._chore(self._abort(identity, msg))
        elif isinstance(msg, ReleaseTensors):
            self._release_tensors(msg)
        elif isinstance(msg, Inspect):
            self._chore(self._inspect(identity, msg, set(self._chores)))
        elif msg.request_id in self.jobs:
            self._refuse(identity, msg, "ValueError", "a job with this request id is already "
                                                      "running")
        elif len(self.jobs) >= self.spec.max_jobs:
            self._refuse(identity, msg, "PipelineBusyError",
                         f"{self.spec.max_jobs} jobs already running")
        else:
            try:
                self.ctx.receive_job(msg)
            except Exception as exc:  # e.g. its producer is gone: the job cannot run
                logger.exception("%s: its CUDA IPC tensors could not be mapped", msg.request_id)
                self._chore(self._send(identity, RequestError(
                    msg.request_id, type(exc).__name__, f"mapping its CUDA IPC tensors: {exc}")))
                return
            self.jobs[msg.request_id] = asyncio.create_task(self._run_job(identity, msg))

    async def _inspect(self, identity: bytes, msg: Inspect, chores: set[Any]) -> None:
        """What the worker serves and its engine holds, told once the chores begun before the
        question are done: an abort that came first (it takes a while) shows in the answer."""
        await asyncio.gather(*chores, return_exceptions=True)
        reply = InspectReply(msg.ack, list(self.stage.active_request_ids()), list(self.jobs),
                             self.ctx.sender.exporter.pending, self.ctx.imports.held,
                             cuda_allocated_bytes())
        await self._send(identity, reply)

    def _refuse(self, identity: bytes, job: Job, error: str, message: str) -> None:
        self.ctx.refuse_job(job)
        self._chore(self._send(identity, RequestError(job.request_id, error, message)))

    def _release_tensors(self, msg: ReleaseTensors) -> None:
        """A consumer is done with these CUDA IPC exports of ours (its job ended)."""
        try:
            unknown = self.ctx.sender.release(msg.transfers, msg.delivered)
        except Exception:  # never let a release end the receive loop
            logger.exception("stage %s: release of CUDA IPC transfers %s failed",
                             self.spec.stage, msg.transfers)
            return
        if unknown:  # exports of a worker this one replaced, or released twice
            logger.debug("stage %s: release of unknown CUDA IPC transfers %s ignored",
                         self.spec.stage, unknown)

    def _reject(self, identity: bytes, payload: bytes, exc: Exception) -> None:
        """A malformed job still ends its request (the client would wait for it otherwise)."""
        try:
            rid = msgspec.msgpack.decode(payload).get("request_id")
        except Exception:
            rid = None
        logger.error("dropped a malformed message (request %s): %s", rid, exc)
        if isinstance(rid, str):
            self._chore(self._send(identity, RequestError(rid, "ValidationError", str(exc))))

    def _chore(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    async def _run_job(self, identity: bytes, job: Job) -> None:
        finished, unsent = False, None
        try:
            async for output in self.stage.stream(job):
                if output.finished and getattr(output, "finish_reason", None) != "abort":
                    await self._count_served()
                unsent = output
                await self.router.send_multipart([identity, encode(output)])
                unsent = None
                finished = output.finished
            if not finished:  # a stage broke the contract: its client must not wait forever
                raise RuntimeError(f"stage {self.spec.stage} ended {job.request_id} without a "
                                   f"finished output")
        except asyncio.CancelledError:
            raise
        except zmq.ZMQError as exc:  # the client is gone: nobody wants the rest
            logger.warning("%s: client unreachable (%s); aborting", job.request_id, exc)
            await self.stage.abort([job.request_id])
        except StaleBlockError as exc:  # its sender gave a block of it back before it was read
            logger.debug("%s: its input was released unread; waiting for its abort", job.request_id)
            await asyncio.sleep(_STALE_INPUT_WAIT_S)  # the abort cancels this: a quiet end
            logger.error("%s failed: its input was released unread", job.request_id, exc_info=exc)
            await self._send(identity, RequestError(job.request_id, type(exc).__name__, str(exc)))
        except Exception as exc:
            logger.exception("%s failed", job.request_id)
            await self._send(identity, RequestError(job.request_id, type(exc).__name__, str(exc)))
        finally:
            self.jobs.pop(job.request_id, None)
            self.ctx.end_job(job)
            if unsent is not None:  # it never left (client gone, or the job aborted mid-send)
                self._give_back(unsent)

    def _give_back(self, output: Output) -> None:
        """What an output nobody received holds: its blocks to the pool, its exports dropped
        (no consumer ever mapped them). Were it sent after all, its job was aborted: the client
        drops it as a late output, and the second give-back finds nothing left to free."""
        try:
            for ref in output_tensors(output):
                if isinstance(ref, CudaIpcRef):
                    self.ctx.sender.release([ref.transfer], delivered=False)
                else:
                    with contextlib.suppress(StaleBlockError):
                        self.ctx.pool.release(ref)
        except Exception:
            logger.exception("stage %s: giving back an unsent output failed", self.spec.stage)

    async def _abort(self, identity: bytes, msg: Abort) -> None:
        """Abort in the engine, drop the jobs' tasks, and only then acknowledge."""
        began = time.perf_counter()
        tasks = [self.jobs[i] for i in msg.request_ids if i in self.jobs]
        try:
            await self.stage.abort(msg.request_ids)
        except Exception:
            logger.exception("stage %s: abort of %s failed", self.spec.stage, msg.request_ids)
        aborted = time.perf_counter()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_ABORT_WAIT_S)
        logger.debug("abort of %d requests (%d jobs): engine %.1f ms, jobs %.1f ms",
                    len(msg.request_ids), len(tasks), (aborted - began) * 1e3,
                    (time.perf_counter() - aborted) * 1e3)
        if msg.ack:
            await self._send(identity, Aborted(msg.ack))

    async def _send(self, identity: bytes, msg: Any) -> None:
        try:
            await self.router.send_multipart([identity, encode(msg)])
        except zmq.ZMQError as exc:
            logger.warning("reply to a vanished client dropped: %s", exc)

    async def _count_served(self) -> None:
        """One more job served (its last output about to leave). The first is told at once,
        before that output: a worker lost right after serving must not count as one that
        served nothing (the supervisor gives up on those)."""
        self.served += 1
        if self.served == 1:
            await self._beat()

    async def _heartbeat(self) -> None:
        """Beat from the event loop itself, so a blocked loop reads as a hung worker."""
        while True:
            await self._beat()
            await asyncio.sleep(self.spec.heartbeat_s)

    async def _beat(self) -> None:
        """One heartbeat; once the stage can serve no more (its engine died), `Broken`."""
        pid, failure = os.getpid(), self._failure()
        if failure is None:
            beat = encode(Heartbeat(self.spec.stage, pid, len(self.jobs), self.served))
        else:
            beat = encode(Broken(self.spec.stage, pid, failure))
        with contextlib.suppress(zmq.Again):  # the supervisor is busy: the next beat will do
            await self.control.send(beat, flags=zmq.NOBLOCK)

    def _failure(self) -> str | None:
        try:
            failure = self.stage.failure()
        except Exception as exc:  # a check that breaks says the same
            failure = f"its health check raised {_describe(exc)}"
        if failure is not None and not self._broken:
            self._broken = True
            logger.error("stage %s can serve no more: %s; asking to be replaced",
                         self.spec.stage, failure)
        return failure
