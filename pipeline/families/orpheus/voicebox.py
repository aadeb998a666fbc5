"""The orpheus VoiceBox stage: SNAC decode windows to 24 kHz PCM, micro-batched across calls.

Each job's tokens are one decode window (`windows.Window`); jobs from concurrent requests
gather for a few milliseconds, as in the tiny VoiceBox, and windows of one length decode in one
forward. Each job's voiced audio is written into the pool block leased for it. The `device`
setting puts SNAC on a GPU ("cuda"); the audio still goes through the pool.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from pipeline.families.orpheus.snac_decoder import SnacDecoder
from pipeline.families.orpheus.stage_support import model_dir
from pipeline.families.orpheus.windows import Window
from pipeline.families.queued_voicebox import QueuedJob
from pipeline.families.tiny.stage_support import TorchThread
from pipeline.families.tiny.voicebox import BATCH_WINDOW_S, MAX_BATCH, TinyVoiceBox
from pipeline.shm import PoolExhaustedError
from pipeline.shm_lease import BlockLease
from pipeline.stage import StageContext


class SnacVoiceBox(TinyVoiceBox):
    """VoiceBox on SNAC's decoder; the tiny VoiceBox's batching, SNAC's rendering."""

    async def start(self, ctx: StageContext) -> None:
        self.torch = TorchThread(self.name)
        self.snac = await self.torch.run(SnacDecoder.load, model_dir(ctx, "snac"),
                                         str(ctx.settings.get("device", "cpu")))
        self.window = float(ctx.settings.get("batch_window_s", BATCH_WINDOW_S))
        self.max_batch = int(ctx.settings.get("max_batch", MAX_BATCH))
        self.forward_calls = 0
        self.jobs_rendered = 0
        self._serve(ctx, self.snac.sample_rate)

    async def _lease_each(self, live: list[QueuedJob], held: contextlib.ExitStack
                          ) -> list[tuple[QueuedJob, BlockLease]]:
        """A block for each job's voiced audio; a malformed window, or one for which no block
        comes free in time, fails its job alone."""
        leased = []
        for entry in live:
            try:
                voiced = Window.of_tokens(entry.job.tokens).voiced
                lease = await self.ctx.acquire_tensor((voiced * self.snac.samples_per_frame,))
            except (ValueError, PoolExhaustedError) as exc:
                entry.fail(exc)
                continue
            leased.append((entry, held.enter_context(lease)))
        return leased

    def _render(self, token_lists: list[list[int]], outs: list[np.ndarray]) -> None:
        """Decode the windows (in the torch thread) into `outs`, the jobs' blocks."""
        audio = self.snac.render([Window.of_tokens(tokens) for tokens in token_lists])
        for wave, out in zip(audio, outs, strict=True):
            torch.from_numpy(out).copy_(wave)
        self.forward_calls += 1
        self.jobs_rendered += len(token_lists)
