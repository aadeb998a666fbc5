"""The fake family on a GPU: the Thinker's embeddings reach the Talker by CUDA IPC.

The embedding of Thinker token i is the row i * ROW + arange(HIDDEN), float32 on cuda:0, sent
with `ctx.send_rows` (a CUDA IPC export while the pipeline's `cuda_ipc` is on). The Talker
takes its job's pieces with `ctx.take_tensors`, refuses them unless they came on the GPU with
every row's pattern intact, and speaks token i for row i, so the audio says which rows arrived,
in order. Only a GPU host runs it (tests/test_cuda_ipc_gpu.py skips it elsewhere).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import torch

from pipeline.stage import StageContext, TalkerJob, TalkerOutput, ThinkerJob, ThinkerOutput
from tests.fake_family import HIDDEN, FakeTalker, FakeThinker, FakeVoiceBox, reply_words

ROW = 1000  # rows stay exact integers in float32 up to 2**24, far past any reply length


def _cuda_up() -> torch.device:
    """cuda:0, with its context made now: at start, not inside a job on the event loop."""
    device = torch.device("cuda", 0)
    torch.zeros(1, device=device)
    return device


class CudaThinker(FakeThinker):
    async def start(self, ctx: StageContext) -> None:
        await super().start(ctx)
        self.pattern = torch.arange(HIDDEN, dtype=torch.float32, device=_cuda_up())

    async def stream(self, job: ThinkerJob) -> AsyncIterator[ThinkerOutput]:
        words = reply_words(job.max_tokens)
        async for i in self._steps(job.request_id, len(words)):
            embeds = await self.ctx.send_rows((self.pattern + i * ROW).unsqueeze(0))
            text = words[i] if i == 0 else " " + words[i]
            yield ThinkerOutput(job.request_id, text=text, token_ids=[i], embeds=embeds)
        yield ThinkerOutput(job.request_id, finished=True, finish_reason="length")


class CudaTalker(FakeTalker):
    async def start(self, ctx: StageContext) -> None:
        await super().start(ctx)
        _cuda_up()

    async def stream(self, job: TalkerJob) -> AsyncIterator[TalkerOutput]:
        rows = self.ctx.take_tensors(job.text_embeds)
        if not isinstance(rows, torch.Tensor) or not rows.is_cuda:
            raise TypeError(f"{job.request_id}: the text embeddings did not come on the GPU")
        first = rows[:, :1]
        pattern = torch.arange(HIDDEN, dtype=rows.dtype, device=rows.device)
        if rows.shape[1] != HIDDEN or not torch.equal(rows - first, pattern.expand_as(rows)):
            raise ValueError(f"{job.request_id}: text embeddings corrupted in transit")
        tokens = [round(value / ROW) for value in first[:, 0].tolist()]
        async for output in self.speak(job, tokens):
            yield output


STAGES: dict[str, Any] = {"thinker": CudaThinker, "talker": CudaTalker, "voicebox": FakeVoiceBox}
