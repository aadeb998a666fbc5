"""The API process's end of one stage worker: an async zmq DEALER client.

`submit(job)` streams that job's outputs, routed by request id into a bounded per-request inbox;
`abort(ids)` drops the requests here at once and waits for the worker's acknowledgement that
they are gone from its engine; `inspect()` asks what the worker and its engine still hold;
`release_tensors(transfers)` tells the worker its CUDA IPC exports are done with.
Several client processes may connect to the same worker. A lost connection (the worker died)
fails every request in flight with `StageFailedError`; a request with no output for the stall
timeout is aborted and fails with `StageStalledError` (and when no request of the stage got
any output meanwhile, `on_stuck` asks for a new worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from pipeline.errors import (
    PipelineBusyError,
    PipelineError,
    RequestFailedError,
    StageFailedError,
    StageStalledError,
)
from pipeline.runtime.messages import (
    Abort,
    Aborted,
    Inspect,
    InspectReply,
    ReleaseTensors,
    RequestError,
    encode,
    worker_decoder,
)
from pipeline.stage import Job, Output, output_tensors
from pipeline.tensors.cuda_ipc import CudaIpcRef
from pipeline.tensors.shm import BlockPool, BlockRef, StaleBlockError

logger = logging.getLogger(__name__)

# Inspect is a diagnostic with no caller waiting on it: a worker's loop, niced below the API
# process on a loaded machine, may take over a second to get to it (aborts keep their 1 s).
INSPECT_TIMEOUT_S = 10.0


def release_quietly(pool: BlockPool, ref: BlockRef | None) -> None:
    """Release `ref` unless someone already did (the reader, or a reclaim after a death)."""
    if ref is not None:
        with contextlib.suppress(StaleBlockError):
            pool.release(ref)


class _Inbox:
    """One request's bounded queue of outputs; it ends quietly (aborted) or with an error."""

    def __init__(self, limit: int) -> None:
        self.items: deque[Output] = deque()
        self.limit = limit
        self.ended = False
        self.error: PipelineError | None = None
        self._wake = asyncio.Event()

    def push(self, output: Output) -> bool:
        if len(self.items) >= self.limit:
            return False
        self.items.append(output)
        self._wake.set()
        return True

    def end(self, error: PipelineError | None = None) -> None:
        self.ended, self.error = True, error
        self._wake.set()

    async def get(self, stall_s: float) -> Output | None:
        """The next output; None once the request was aborted; raises its error if it failed,
        TimeoutError when nothing came for `stall_s`.

        Once ended, nothing more is handed out: what is still queued is the caller's to release.
        """
        while True:
            if self.error is not None:
                raise self.error
            if self.ended:
                return None
            if self.items:
                return self.items.popleft()
            self._wake.clear()
            async with asyncio.timeout(stall_s):
                await self._wake.wait()


class StageClient:
    """Submit jobs to one stage worker and stream their outputs back."""

    def __init__(self, stage: str, endpoint: str, pool: BlockPool, *, queue_size: int = 1024,
                 abort_timeout_s: float = 1.0, connect_timeout_s: float = 10.0,
                 stall_timeout_s: float = 30.0,
                 on_stuck: Callable[[str, str], None] | None = None) -> None:
        self.stage, self.endpoint, self.pool = stage, endpoint, pool
        self.queue_size, self.stall_timeout_s = queue_size, stall_timeout_s
        self.on_stuck = on_stuck  # (stage, reason): the worker answers nothing at all
        self._last_output = time.monotonic()  # of any request: the stage's engine progressed
        self.abort_timeout_s, self.connect_timeout_s = abort_timeout_s, connect_timeout_s
        self._inboxes: dict[str, _Inbox] = {}
        self._acks: dict[int, asyncio.Future[Any]] = {}
        self._ack_ids = itertools.count(1)
        self._connected = asyncio.Event()
        self._ctx = zmq.asyncio.Context.instance()
        self._sock: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._sends: set[asyncio.Future[Any]] = set()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def connect(self) -> None:
        """Open the socket; the connection itself comes up (and back) in the background."""
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # never queue jobs for a worker that is not there
        # A steady 20 ms retry (no exponential back-off): a restarted worker is reached at once.
        sock.setsockopt(zmq.RECONNECT_IVL, 20)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 0)
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        sock.connect(self.endpoint)
        self._sock = sock
        self._tasks = [asyncio.create_task(self._receive(sock)),
                       asyncio.create_task(self._watch(monitor))]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.fail_pending("the client was closed")
        if self._sock is not None:
            self._connected.clear()  # late cleanup sends nothing more
            self._sock.disable_monitor()
            self._sock.close()

    async def submit(self, job: Job, on_sent: Callable[[], None] | None = None
                     ) -> AsyncGenerator[Output, None]:
        """Run `job` in the worker, yielding its outputs until the one with finished=True.

        `on_sent` is called once the job has left for the worker (whoever passed tensors on in
        it needs to know whether a consumer ever received them)."""
        rid = job.request_id
        if rid in self._inboxes:
            raise ValueError(f"request {rid} is already in flight")
        await self.wait_connected()
        sock = self._sock
        assert sock is not None  # wait_connected() raised otherwise
        inbox = self._inboxes[rid] = _Inbox(self.queue_size)
        try:
            await sock.send(encode(job))
            if on_sent is not None:
                on_sent()
            while (output := await self._next(inbox, rid)) is not None:
                yield output
                if output.finished:
                    return
        finally:
            if self._inboxes.pop(rid, None) is not None:  # left early: the worker must drop it
                self._send_soon(Abort([rid]))
            self._discard(inbox.items)

    async def _next(self, inbox: _Inbox, rid: str) -> Output | None:
        """The request's next output. A request silent past the stall timeout is aborted in
        the worker (acknowledged, or given up after the abort timeout), then fails."""
        try:
            return await inbox.get(self.stall_timeout_s)
        except TimeoutError:
            pass
        logger.error("stage %s: request %s stalled: no output for %g s; aborting it",
                     self.stage, rid, self.stall_timeout_s)
        silent_s = time.monotonic() - self._last_output
        if silent_s >= self.stall_timeout_s and self.on_stuck is not None:
            # Not one request of the stage got an output meanwhile: not a slow request, but
            # a stuck engine, which only a new worker mends.
            self.on_stuck(self.stage, f"no output for any request for {silent_s:.0f} s (stuck)")
        try:
            await self.abort([rid])
            aborted = "the request was aborted"
        except StageFailedError as exc:
            aborted = f"its abort was not acknowledged ({exc.reason})"
        raise StageStalledError(self.stage, f"no output for {self.stall_timeout_s:g} s "
                                            f"(stalled); {aborted}")

    def abort(self, request_ids: list[str]) -> Awaitable[None]:
        """End these requests here now; the awaitable waits until the worker has dropped them.

        The local part (their streams end, later outputs are discarded) is done before this
        returns, so a caller can rely on it without awaiting.
        """
        ids = [rid for rid in request_ids if rid in self._inboxes]
        for rid in ids:
            self._inboxes.pop(rid).end()
        if not ids or not self.connected:
            return _done()
        ack = next(self._ack_ids)
        return self._request(Abort(ids, ack), ack, f"abort of {len(ids)} requests",
                             self.abort_timeout_s)

    def release_tensors(self, transfers: list[int], delivered: bool = True) -> None:
        """Tell the worker (their producer) that these CUDA IPC exports are done with: their
        consuming job has ended, or (`delivered=False`) no consumer ever received them.
        Fire-and-forget: a worker that is gone took its exports with it."""
        if transfers:
            self._send_soon(ReleaseTensors(list(transfers), delivered))

    async def inspect(self) -> InspectReply:
        """What the worker is serving and what its engine still holds."""
        await self.wait_connected()
        ack = next(self._ack_ids)
        reply = await self._request(Inspect(ack), ack, "inspect", INSPECT_TIMEOUT_S)
        if not isinstance(reply, InspectReply):  # None: the worker died (fail_pending)
            raise StageFailedError(self.stage, "the worker went away during inspect")
        return reply

    def fail_pending(self, reason: str) -> None:
        """Fail every request in flight (the worker died): their streams raise StageFailedError."""
        error = StageFailedError(self.stage, reason)
        inboxes, self._inboxes = self._inboxes, {}
        for inbox in inboxes.values():
            inbox.end(error)
        for fut in self._acks.values():
            if not fut.done():
                fut.set_result(None)  # nothing left to abort or inspect in a dead worker
        if inboxes:
            logger.warning("stage %s: %d requests failed: %s", self.stage, len(inboxes), reason)

    async def wait_connected(self) -> None:
        """Wait (up to the connect timeout) until the worker is reachable."""
        if self._sock is None:
            raise StageFailedError(self.stage, "client not connected (pipeline not started)")
        if self._connected.is_set():
            return
        # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that
        # arrives as the awaited thing completes, and a cancelled turn must stop at once.
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await self._connected.wait()
        except TimeoutError:
            raise StageFailedError(
                self.stage, f"no connection to the worker within {self.connect_timeout_s:g} s"
            ) from None

    async def _request(self, msg: Any, ack: int, what: str, timeout_s: float) -> Any:
        sock = self._sock
        assert sock is not None  # only asked of a connected client (see abort, inspect)
        fut = self._acks[ack] = asyncio.get_running_loop().create_future()
        try:
            await sock.send(encode(msg))
            async with asyncio.timeout(timeout_s):
                return await fut
        except TimeoutError:
            logger.warning("stage %s: no reply to %s within %g s", self.stage, what, timeout_s)
            raise StageFailedError(self.stage, f"no reply to {what}") from None
        finally:
            self._acks.pop(ack, None)

    def _send_soon(self, msg: Any) -> None:
        """Send without awaiting (from cleanup code); failures are logged, not raised."""
        if self._sock is None or not self.connected:
            return
        try:
            # A Future on asyncio (pyzmq types it as any awaitable): ensure_future returns it.
            fut = asyncio.ensure_future(self._sock.send(encode(msg)))
        except zmq.ZMQError as exc:
            logger.warning("stage %s: send failed: %s", self.stage, exc)
            return
        self._sends.add(fut)
        fut.add_done_callback(self._sent)

    def _sent(self, fut: asyncio.Future[Any]) -> None:
        self._sends.discard(fut)
        if not fut.cancelled() and fut.exception() is not None:
            logger.warning("stage %s: send failed: %s", self.stage, fut.exception())

    async def _receive(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            payload = await sock.recv()
            try:
                msg = worker_decoder.decode(payload)
            except Exception as exc:
                logger.error("stage %s: undecodable message dropped: %s", self.stage, exc)
                continue
            self._route(msg)

    def _route(self, msg: Any) -> None:
        if isinstance(msg, (Aborted, InspectReply)):
            fut = self._acks.get(msg.ack)
            if fut is not None and not fut.done():
                fut.set_result(msg)
            return
        inbox = self._inboxes.get(msg.request_id)
        if isinstance(msg, RequestError):
            if inbox is not None:
                del self._inboxes[msg.request_id]
                inbox.end(RequestFailedError(self.stage, f"{msg.error}: {msg.message}"))
            return
        self._last_output = time.monotonic()
        if inbox is None:  # a late output of an aborted request: give its tensors back
            self._discard([msg])
            return
        if not inbox.push(msg):
            del self._inboxes[msg.request_id]
            inbox.end(PipelineBusyError(
                f"{msg.request_id}: more than {self.queue_size} outputs waiting; the consumer "
                f"is not keeping up"))
            self._discard([msg])
            self._send_soon(Abort([msg.request_id]))
        elif msg.finished:
            del self._inboxes[msg.request_id]

    def _discard(self, outputs: Iterable[Output]) -> None:
        """Give back the tensors of outputs nobody will read: blocks to the pool, CUDA IPC
        exports to this worker, which made them (no consumer ever received them)."""
        transfers = []
        for output in outputs:
            for ref in output_tensors(output):
                if isinstance(ref, CudaIpcRef):
                    transfers.append(ref.transfer)
                else:
                    release_quietly(self.pool, ref)
        self.release_tensors(transfers, delivered=False)

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        """Track the connection; when it drops, whatever the worker held is lost."""
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self._connected.set()
                elif event["event"] == zmq.EVENT_DISCONNECTED:
                    self._connected.clear()
                    self.fail_pending("the connection to the worker was lost (worker died)")
        finally:
            monitor.close(linger=0)


async def _done() -> None:
    return None
