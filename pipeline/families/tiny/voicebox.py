"""The tiny family's VoiceBox stage: speech tokens to 24 kHz PCM, micro-batched across calls.

Jobs from concurrent requests are batched as the kit's batched VoiceBox batches them
(`kit/batched_voicebox.py`); one forward renders a batch (padded to the longest) in the
stage's torch thread, and the last step (the tanh) writes each job's PCM (float32 mono)
straight into the pool block leased for it.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.families.kit.batched_voicebox import BatchedVoiceBox
from pipeline.families.kit.torch_thread import TorchThread
from pipeline.families.tiny.stage_support import part_dir
from pipeline.families.tiny.voice_decoder import load_voice_decoder
from pipeline.stage import StageContext, VoiceBoxJob


class TinyVoiceBox(BatchedVoiceBox[list[int]]):
    """VoiceBox on the tiny family's upsampling decoder."""

    async def start(self, ctx: StageContext) -> None:
        self.torch = TorchThread(self.name)
        self.decoder = await self.torch.run(load_voice_decoder, part_dir(ctx, "voicebox"))
        self._batch(ctx, self.decoder.config.sample_rate)

    def _plan(self, job: VoiceBoxJob) -> list[int]:
        return job.tokens

    def _samples_of(self, plan: list[int]) -> int:
        return len(plan) * self.decoder.config.samples_per_token

    def _render_batch(self, jobs: list[tuple[VoiceBoxJob, list[int]]], outs: list[np.ndarray]
                      ) -> None:
        """One forward over the batch, its last step (the tanh) writing each job's PCM,
        trimmed, into `outs` (the jobs' blocks)."""
        token_lists = [tokens for _, tokens in jobs]
        longest = max(1, *(len(tokens) for tokens in token_lists))
        batch = torch.zeros(len(token_lists), longest, dtype=torch.long)
        for row, tokens in enumerate(token_lists):
            batch[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        wave = self.decoder.pre_tanh(batch.clamp_(0, self.decoder.config.n_codes - 1))
        step = self.decoder.config.samples_per_token
        with torch.inference_mode():
            for row, (tokens, out) in enumerate(zip(token_lists, outs, strict=True)):
                torch.tanh(wave[row, : len(tokens) * step], out=torch.from_numpy(out))
