"""A VoiceBox stage that renders queued jobs in one task: the part every family shares.

A stream puts its job in a bounded queue (full: it waits, which is the back-pressure) and waits
for the job's PCM; the stage's render task takes jobs from the queue and answers each with its
PCM or an error. A render task writes the PCM straight into a pool block it leased
(`ctx.acquire_tensor`) and answers with the block's ref (a job answered with an array has it
copied into a block); a rendered block whose job nobody waits for any more is released.
Aborting a request answers its waiting jobs with None: their streams end without PCM, and the
render task skips them. A job without tokens (a turn's closing job, VoiceBoxJob.more) is
answered at once without PCM, unless the family holds a turn's tokens back (`holds_tokens`).
Should the render task ever end, every waiting job fails and new ones are refused, so no stream
hangs on it. Each family renders its own way: the tiny, orpheus and qwen25_omni VoiceBoxes in
micro-batches (`batched_voicebox.py`), the local one a job at a time.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from pipeline.stage import Stage, StageContext, VoiceBoxJob, VoiceBoxOutput
from pipeline.tensors.shm import BlockRef

logger = logging.getLogger(__name__)

MAX_QUEUED = 256
Rendered = BlockRef | np.ndarray  # PCM written into a pool block, or an array to copy into one


def _keep(pcm: Rendered) -> None:
    """An array nobody reads needs no giving back."""


@dataclass(eq=False)
class QueuedJob:
    """A queued VoiceBox job and the future its PCM arrives on (None: aborted)."""

    job: VoiceBoxJob
    discard: Callable[[Rendered], None] = _keep  # gives back PCM nobody will read
    result: asyncio.Future[Rendered | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def waiting(self) -> bool:
        """Whether the job is still unanswered (not rendered, failed, aborted or abandoned)."""
        return not self.result.done()

    def deliver(self, pcm: Rendered) -> None:
        """Answer the job with its PCM; if it was answered (or abandoned) meanwhile, the PCM
        is discarded (a block goes back to the pool)."""
        if self.waiting:
            self.result.set_result(pcm)
        else:
            self.discard(pcm)

    def fail(self, error: BaseException) -> None:
        """Answer the job with an error, unless it was answered (or abandoned) meanwhile."""
        if self.waiting:
            self.result.set_exception(error)


class VoiceBoxJobs:
    """A VoiceBox stage's jobs: the bounded queue, and each request's jobs still in the stage."""

    def __init__(self, max_queued: int, discard: Callable[[Rendered], None] = _keep) -> None:
        self._queue: asyncio.Queue[QueuedJob] = asyncio.Queue(max_queued)
        self._by_request: dict[str, list[QueuedJob]] = {}
        self._discard = discard

    async def rendered(self, job: VoiceBoxJob) -> Rendered | None:
        """Queue the job and wait for its PCM: None when the job was aborted first."""
        entry = QueuedJob(job, self._discard)
        self._by_request.setdefault(job.request_id, []).append(entry)
        try:
            await self._queue.put(entry)  # full queue: the caller waits (back-pressure)
            return await entry.result
        except BaseException:  # cancelled after the PCM came: nobody else will give it back
            result = entry.result
            if result.done() and not result.cancelled() and result.exception() is None:
                pcm = result.result()
                if pcm is not None:
                    entry.discard(pcm)
            raise
        finally:
            if entry.waiting:  # the caller went away: the render task skips the job
                entry.result.cancel()
            self._forget(entry)

    async def get(self) -> QueuedJob:
        """The next job in the queue (it may have been answered while it waited)."""
        return await self._queue.get()

    def get_queued(self, limit: int) -> list[QueuedJob]:
        """Up to `limit` more jobs, of those already in the queue (no waiting)."""
        taken: list[QueuedJob] = []
        while len(taken) < limit and not self._queue.empty():
            taken.append(self._queue.get_nowait())
        return taken

    def abort(self, request_ids: list[str]) -> None:
        """Answer these requests' waiting jobs with None: their streams end without PCM."""
        for request_id in request_ids:
            for entry in self._by_request.get(request_id, []):
                if entry.waiting:
                    entry.result.set_result(None)

    def fail_waiting(self, message: str) -> None:
        """Fail every waiting job with a RuntimeError(message): when the render task is gone."""
        for entries in self._by_request.values():
            for entry in entries:
                entry.fail(RuntimeError(message))

    def active_request_ids(self) -> list[str]:
        """Requests with a job still waiting for its PCM."""
        return sorted(rid for rid, entries in self._by_request.items()
                      if any(entry.waiting for entry in entries))

    def _forget(self, entry: QueuedJob) -> None:
        entries = self._by_request.get(entry.job.request_id, [])
        if entry in entries:
            entries.remove(entry)
        if not entries:
            self._by_request.pop(entry.job.request_id, None)


class QueuedVoiceBox(Stage[VoiceBoxJob, VoiceBoxOutput]):
    """A VoiceBox stage whose jobs wait in a `VoiceBoxJobs` queue for its one render task.

    A subclass loads its model in start() and then calls `_serve`; its `_render_jobs` takes
    jobs from `self.jobs` and answers them, forever; its `_close` frees what start() made.
    """

    name = "voicebox"
    task_label: str  # the render task's name in logs and errors ("batcher", "renderer")
    # Whether a turn's jobs leave tokens here for its later ones (lookahead held back): then
    # a job without tokens (the turn's closing one) may still voice some and is rendered;
    # otherwise it has nothing to voice and is answered at once, without PCM.
    holds_tokens: ClassVar[bool] = False

    def _serve(self, ctx: StageContext, sample_rate: int) -> None:
        """Open the job queue and start the render task."""
        self.ctx = ctx
        self.sample_rate = sample_rate
        self.jobs = VoiceBoxJobs(int(ctx.settings.get("max_queued", MAX_QUEUED)), self._discard)
        self.render_task = asyncio.create_task(self._render_jobs(),
                                               name=f"voicebox-{self.task_label}")
        self.render_task.add_done_callback(self._render_task_ended)

    @abc.abstractmethod
    async def _render_jobs(self) -> None:
        """Take jobs from `self.jobs` and answer them (deliver or fail), forever."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Free what start() made (the render thread), once the render task has ended."""

    async def stream(self, job: VoiceBoxJob) -> AsyncIterator[VoiceBoxOutput]:
        if self.render_task.done():
            raise RuntimeError(f"the voicebox {self.task_label} has stopped; this stage serves "
                               f"no more jobs")
        if not job.tokens and not self.holds_tokens:
            yield VoiceBoxOutput(job.request_id, finished=True)
            return
        pcm = await self.jobs.rendered(job)
        if pcm is None:
            yield VoiceBoxOutput(job.request_id, finished=True)
            return
        ref = pcm if isinstance(pcm, BlockRef) else await self.ctx.pool.put(
            pcm, self.ctx.pool_timeout_s)
        yield VoiceBoxOutput(job.request_id, pcm=ref, sample_rate=self.sample_rate,
                             finished=True)

    async def abort(self, request_ids: list[str]) -> None:
        """Drop these requests' waiting jobs: their streams end without PCM."""
        self.jobs.abort(request_ids)

    def active_request_ids(self) -> list[str]:
        return self.jobs.active_request_ids()

    async def stop(self) -> None:
        self.render_task.cancel()
        await asyncio.gather(self.render_task, return_exceptions=True)
        self._close()

    def _discard(self, pcm: Rendered) -> None:
        """Give back a rendered block whose job nobody waits for any more."""
        if isinstance(pcm, BlockRef):
            self.ctx.pool.release(pcm)

    def _render_task_ended(self, task: asyncio.Task[None]) -> None:
        """Fail every waiting job if the render task ever ends: no stream may hang on it."""
        error = None if task.cancelled() else task.exception()
        if error is not None:
            logger.error("voicebox %s died", self.task_label, exc_info=error)
        self.jobs.fail_waiting(f"the voicebox {self.task_label} has stopped")
