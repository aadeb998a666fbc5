"""A VoiceBox that renders its queued jobs in micro-batches across calls, in a torch thread.

Jobs from concurrent requests wait a few milliseconds (`batch_window_s`) in the bounded queue,
then one call renders them all (at most `max_batch`) in the stage's torch thread, writing each
job's PCM (float32 mono) straight into the pool block leased for it, which is sent as it is. A
job that cannot be rendered (a malformed window), or for which no block comes free in time,
fails alone; a batch whose rendering raises fails its jobs, not the stage. `forward_calls` and
`jobs_rendered` count the batching.

A subclass loads its model into `self.torch` (a TorchThread) in start(), then calls `_batch`.
It plans each job (`_plan`: every job of a batch, in queue order, aborted ones too, so that a
family whose turns carry tokens from job to job advances them), says how many samples a plan
renders to (`_samples_of`) and renders a batch of plans into the jobs' blocks
(`_render_batch`). The tiny, orpheus and qwen25_omni VoiceBoxes are three.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from typing import Generic, TypeVar

import numpy as np

from pipeline.families.kit.queued_voicebox import QueuedJob, QueuedVoiceBox
from pipeline.families.kit.torch_thread import TorchThread
from pipeline.stage import StageContext, VoiceBoxJob
from pipeline.tensors.shm import PoolExhaustedError
from pipeline.tensors.shm_lease import BlockLease

logger = logging.getLogger(__name__)

BATCH_WINDOW_S = 0.004  # how long a batch's first job waits for others to join it
MAX_BATCH = 16

Plan = TypeVar("Plan")  # what a job renders: its tokens, a decode window


class BatchedVoiceBox(QueuedVoiceBox, Generic[Plan]):
    """A queued VoiceBox whose render task renders the jobs queued together as one batch."""

    task_label = "batcher"
    torch: TorchThread

    def _batch(self, ctx: StageContext, sample_rate: int) -> None:
        """Read the batching settings and start serving (the end of a subclass's start())."""
        self.window_s = float(ctx.settings.get("batch_window_s", BATCH_WINDOW_S))
        self.max_batch = int(ctx.settings.get("max_batch", MAX_BATCH))
        self.forward_calls = 0
        self.jobs_rendered = 0
        self._serve(ctx, sample_rate)

    @abc.abstractmethod
    def _plan(self, job: VoiceBoxJob) -> Plan:
        """What `job` renders; ValueError when it cannot be rendered (the job fails alone)."""

    @abc.abstractmethod
    def _samples_of(self, plan: Plan) -> int:
        """The PCM samples `plan` renders to."""

    @abc.abstractmethod
    def _render_batch(self, jobs: list[tuple[VoiceBoxJob, Plan]], outs: list[np.ndarray]
                      ) -> None:
        """Render each job's plan into its out (its block, `_samples_of` samples long), in
        the torch thread."""

    async def _render_jobs(self) -> None:
        while True:
            batch = [await self.jobs.get()]
            await asyncio.sleep(self.window_s)  # let concurrent requests' jobs join the batch
            batch += self.jobs.get_queued(self.max_batch - len(batch))
            planned = [(entry, plan) for entry in batch  # in order: turns advance
                       if (plan := self._planned(entry)) is not None and entry.waiting]
            if planned:
                await self._render_planned(planned)

    def _planned(self, entry: QueuedJob) -> Plan | None:
        try:
            return self._plan(entry.job)
        except ValueError as exc:
            entry.fail(exc)
            return None

    async def _render_planned(self, planned: list[tuple[QueuedJob, Plan]]) -> None:
        """Lease each job's block, render the batch into them and answer each job."""
        with contextlib.ExitStack() as held:  # blocks not sent go back on the way out
            leased = await self._lease_each(planned, held)
            if not leased:
                return
            try:
                await self.torch.run(self._render, [(entry.job, plan) for entry, plan, _ in leased],
                                     [lease.array for _, _, lease in leased])
            except Exception as exc:  # one bad batch fails its jobs, not the stage
                logger.exception("voicebox batch of %d jobs failed", len(leased))
                for entry, _, _ in leased:
                    entry.fail(exc)
                return
            for entry, _, lease in leased:
                entry.deliver(lease.send())

    async def _lease_each(self, planned: list[tuple[QueuedJob, Plan]],
                          held: contextlib.ExitStack
                          ) -> list[tuple[QueuedJob, Plan, BlockLease]]:
        """A block for each job's PCM; a job for which none comes free in time (or none is
        large enough) fails alone."""
        leased = []
        for entry, plan in planned:
            try:
                lease = await self.ctx.acquire_tensor((self._samples_of(plan),))
            except (ValueError, PoolExhaustedError) as exc:
                entry.fail(exc)
                continue
            leased.append((entry, plan, held.enter_context(lease)))
        return leased

    def _render(self, jobs: list[tuple[VoiceBoxJob, Plan]], outs: list[np.ndarray]) -> None:
        self._render_batch(jobs, outs)
        self.forward_calls += 1
        self.jobs_rendered += len(jobs)

    def _close(self) -> None:
        self.torch.close()
