"""The tiny family's VoiceBox stage: speech tokens to 24 kHz PCM, micro-batched across calls.

Jobs from concurrent requests wait a few milliseconds in a bounded queue, then one batched
forward renders them all (padded to the longest) in the stage's torch thread; each job's PCM
(float32 mono) goes into a pool block. `forward_calls` and `jobs_rendered` count the batching.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
import torch

from pipeline.families.tiny.stage_support import TorchThread, part_dir, pool_timeout
from pipeline.families.tiny.voice_decoder import load_voice_decoder
from pipeline.stage import Stage, StageContext, VoiceBoxJob, VoiceBoxOutput

logger = logging.getLogger(__name__)

BATCH_WINDOW_S = 0.004
MAX_BATCH = 16
MAX_QUEUED = 256


@dataclass(eq=False)
class _Pending:
    """A queued job and the future its PCM arrives on (None: aborted)."""

    job: VoiceBoxJob
    result: asyncio.Future[np.ndarray | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class TinyVoiceBox(Stage):
    """VoiceBox on the tiny family's upsampling decoder."""

    name = "voicebox"

    async def start(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self.torch = TorchThread(self.name)
        self.decoder = await self.torch.run(load_voice_decoder, part_dir(ctx, "voicebox"))
        self.sample_rate = self.decoder.config.sample_rate
        self.window = float(ctx.settings.get("batch_window_s", BATCH_WINDOW_S))
        self.max_batch = int(ctx.settings.get("max_batch", MAX_BATCH))
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue(
            int(ctx.settings.get("max_queued", MAX_QUEUED)))
        self.pending: dict[str, list[_Pending]] = {}
        self.forward_calls = 0
        self.jobs_rendered = 0
        self.batcher = asyncio.create_task(self._batch_loop(), name="voicebox-batcher")
        self.batcher.add_done_callback(self._batcher_ended)

    async def stream(self, job: VoiceBoxJob) -> AsyncIterator[VoiceBoxOutput]:
        if self.batcher.done():
            raise RuntimeError("the voicebox batcher has stopped; this stage serves no more jobs")
        entry = _Pending(job)
        self.pending.setdefault(job.request_id, []).append(entry)
        try:
            await self.queue.put(entry)  # full queue: the caller waits (back-pressure)
            pcm = await entry.result
        finally:
            self._forget(entry)
        if pcm is None:
            yield VoiceBoxOutput(job.request_id, finished=True)
            return
        ref = await self.ctx.pool.put(pcm, pool_timeout(self.ctx))
        yield VoiceBoxOutput(job.request_id, pcm=ref, sample_rate=self.sample_rate,
                             finished=True)

    async def abort(self, request_ids: list[str]) -> None:
        """Drop these requests' queued jobs: their streams end without PCM."""
        for request_id in request_ids:
            for entry in self.pending.get(request_id, []):
                if not entry.result.done():
                    entry.result.set_result(None)

    def active_request_ids(self) -> list[str]:
        return sorted(rid for rid, entries in self.pending.items()
                      if any(not e.result.done() for e in entries))

    async def stop(self) -> None:
        self.batcher.cancel()
        await asyncio.gather(self.batcher, return_exceptions=True)
        self.torch.close()

    async def _batch_loop(self) -> None:
        while True:
            batch = [await self.queue.get()]
            await asyncio.sleep(self.window)  # let concurrent requests' jobs join the batch
            while len(batch) < self.max_batch and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            live = [entry for entry in batch if not entry.result.done()]
            if not live:
                continue
            try:
                pcms = await self.torch.run(self._render, [e.job.tokens for e in live])
            except Exception as exc:  # one bad batch fails its jobs, not the stage
                logger.exception("voicebox batch of %d jobs failed", len(live))
                for entry in live:
                    if not entry.result.done():
                        entry.result.set_exception(exc)
                continue
            for entry, pcm in zip(live, pcms, strict=True):
                if not entry.result.done():
                    entry.result.set_result(pcm)

    def _render(self, token_lists: list[list[int]]) -> list[np.ndarray]:
        """One forward over the batch (in the torch thread); each job's PCM, trimmed."""
        longest = max(1, *(len(tokens) for tokens in token_lists))
        batch = torch.zeros(len(token_lists), longest, dtype=torch.long)
        for row, tokens in enumerate(token_lists):
            batch[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        wave = self.decoder(batch.clamp_(0, self.decoder.config.n_codes - 1))
        self.forward_calls += 1
        self.jobs_rendered += len(token_lists)
        step = self.decoder.config.samples_per_token
        return [wave[row, : len(tokens) * step].numpy().copy()
                for row, tokens in enumerate(token_lists)]

    def _batcher_ended(self, task: asyncio.Task[None]) -> None:
        """Fail every waiting job if the batcher ever dies: no stream may hang on it."""
        error = None if task.cancelled() else task.exception()
        if error is not None:
            logger.error("voicebox batcher died", exc_info=error)
        for entries in self.pending.values():
            for entry in entries:
                if not entry.result.done():
                    entry.result.set_exception(RuntimeError("the voicebox batcher has stopped"))

    def _forget(self, entry: _Pending) -> None:
        entries = self.pending.get(entry.job.request_id, [])
        if entry in entries:
            entries.remove(entry)
        if not entries:
            self.pending.pop(entry.job.request_id, None)
