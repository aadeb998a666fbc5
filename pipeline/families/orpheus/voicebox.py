"""The orpheus VoiceBox stage: SNAC decode windows to 24 kHz PCM, micro-batched across calls.

Each job's tokens are one decode window (`windows.Window`); jobs from concurrent requests
gather for a few milliseconds (the kit's batched VoiceBox, `kit/batched_voicebox.py`), and
windows of one length decode in one forward. Each job's voiced audio is written into the pool
block leased for it; a malformed window fails its job alone. The `device` setting puts SNAC on
a GPU ("cuda"); the audio still goes through the pool.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.families.kit.batched_voicebox import BatchedVoiceBox
from pipeline.families.kit.torch_thread import TorchThread
from pipeline.families.orpheus.snac_decoder import SnacDecoder
from pipeline.families.orpheus.stage_support import model_dir
from pipeline.families.orpheus.windows import Window
from pipeline.stage import StageContext, VoiceBoxJob


class SnacVoiceBox(BatchedVoiceBox[Window]):
    """VoiceBox on SNAC's decoder: the kit's batching, SNAC's rendering."""

    async def start(self, ctx: StageContext) -> None:
        self.torch = TorchThread(self.name)
        self.snac = await self.torch.run(SnacDecoder.load, model_dir(ctx, "snac"),
                                         str(ctx.settings.get("device", "cpu")))
        self._batch(ctx, self.snac.sample_rate)

    def _plan(self, job: VoiceBoxJob) -> Window:
        """The job's decode window; ValueError for a malformed one."""
        return Window.of_tokens(job.tokens)

    def _samples_of(self, plan: Window) -> int:
        return plan.voiced * self.snac.samples_per_frame

    def _render_batch(self, jobs: list[tuple[VoiceBoxJob, Window]], outs: list[np.ndarray]
                      ) -> None:
        """Decode the windows into `outs`, the jobs' blocks."""
        audio = self.snac.render([window for _, window in jobs])
        for wave, out in zip(audio, outs, strict=True):
            torch.from_numpy(out).copy_(wave)
