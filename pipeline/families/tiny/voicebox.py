"""The tiny family's VoiceBox stage: speech tokens to 24 kHz PCM, micro-batched across calls.

Jobs from concurrent requests wait a few milliseconds in a bounded queue, then one batched
forward renders them all (padded to the longest) in the stage's torch thread; the last step (the
tanh) writes each job's PCM (float32 mono) straight into the pool block leased for it, which is
sent as it is. `forward_calls` and `jobs_rendered` count the batching.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import numpy as np
import torch

from pipeline.families.queued_voicebox import QueuedJob, QueuedVoiceBox
from pipeline.families.tiny.stage_support import TorchThread, part_dir
from pipeline.families.tiny.voice_decoder import load_voice_decoder
from pipeline.shm import PoolExhaustedError
from pipeline.shm_lease import BlockLease
from pipeline.stage import StageContext

logger = logging.getLogger(__name__)

BATCH_WINDOW_S = 0.004
MAX_BATCH = 16


class TinyVoiceBox(QueuedVoiceBox):
    """VoiceBox on the tiny family's upsampling decoder."""

    task_label = "batcher"

    async def start(self, ctx: StageContext) -> None:
        self.torch = TorchThread(self.name)
        self.decoder = await self.torch.run(load_voice_decoder, part_dir(ctx, "voicebox"))
        self.window = float(ctx.settings.get("batch_window_s", BATCH_WINDOW_S))
        self.max_batch = int(ctx.settings.get("max_batch", MAX_BATCH))
        self.forward_calls = 0
        self.jobs_rendered = 0
        self._serve(ctx, self.decoder.config.sample_rate)

    async def _render_jobs(self) -> None:
        while True:
            batch = [await self.jobs.get()]
            await asyncio.sleep(self.window)  # let concurrent requests' jobs join the batch
            batch += self.jobs.get_queued(self.max_batch - len(batch))
            live = [entry for entry in batch if entry.waiting]
            if not live:
                continue
            with contextlib.ExitStack() as held:  # blocks not sent go back on the way out
                leased = await self._lease_each(live, held)
                if not leased:
                    continue
                try:
                    await self.torch.run(self._render, [e.job.tokens for e, _ in leased],
                                         [lease.array for _, lease in leased])
                except Exception as exc:  # one bad batch fails its jobs, not the stage
                    logger.exception("voicebox batch of %d jobs failed", len(leased))
                    for entry, _ in leased:
                        entry.fail(exc)
                    continue
                for entry, lease in leased:
                    entry.deliver(lease.send())

    async def _lease_each(self, live: list[QueuedJob], held: contextlib.ExitStack
                          ) -> list[tuple[QueuedJob, BlockLease]]:
        """A block for each job's PCM; a job for which none comes free in time fails alone."""
        step = self.decoder.config.samples_per_token
        leased = []
        for entry in live:
            try:
                lease = await self.ctx.acquire_tensor((len(entry.job.tokens) * step,))
            except PoolExhaustedError as exc:
                entry.fail(exc)
                continue
            leased.append((entry, held.enter_context(lease)))
        return leased

    def _render(self, token_lists: list[list[int]], outs: list[np.ndarray]) -> None:
        """One forward over the batch (in the torch thread), its last step (the tanh) writing
        each job's PCM, trimmed, into `outs` (the jobs' blocks)."""
        longest = max(1, *(len(tokens) for tokens in token_lists))
        batch = torch.zeros(len(token_lists), longest, dtype=torch.long)
        for row, tokens in enumerate(token_lists):
            batch[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        wave = self.decoder.pre_tanh(batch.clamp_(0, self.decoder.config.n_codes - 1))
        step = self.decoder.config.samples_per_token
        with torch.inference_mode():
            for row, (tokens, out) in enumerate(zip(token_lists, outs, strict=True)):
                torch.tanh(wave[row, : len(tokens) * step], out=torch.from_numpy(out))
        self.forward_calls += 1
        self.jobs_rendered += len(token_lists)

    def _close(self) -> None:
        self.torch.close()
