"""The tiny family's Thinker stage: a vLLM engine fed prompt embeddings, streaming text.

Each job is one vLLM request whose prompt is the embedded chat history with the caller's audio
spliced in. Every streamed delta carries its tokens' embeddings for the Talker, looked up
straight into a pool block leased for them (`ctx.acquire_tensor`; a family whose embeddings are
on a GPU would send them with `ctx.send_rows`, as CUDA IPC exports).
The weights are random, so by default EOS is ignored and a reply is exactly max_tokens long;
a job with a response_format is guided to its JSON schema and stops when the JSON is complete.
Block ownership: this stage reads `job.audio` in place and releases it once encoded; whoever
consumes a ThinkerOutput gives its `embeds` back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING

import numpy as np

from pipeline.engines.vllm import Sampling, VllmEngine, json_schema_of
from pipeline.families.kit.context_window import fit_history, reply_budget
from pipeline.families.kit.engine_stage import EngineStage
from pipeline.families.kit.recite import recited_pieces
from pipeline.families.kit.request_sampling import with_options
from pipeline.families.kit.torch_thread import TorchThread
from pipeline.families.tiny.stage_support import engine_settings, part_dir
from pipeline.families.tiny.thinker_prompt import ThinkerPromptBuilder
from pipeline.stage import StageContext, ThinkerJob, ThinkerOutput
from pipeline.tensors.cuda_ipc import TensorRef

if TYPE_CHECKING:
    import torch


class TinyThinker(EngineStage[ThinkerJob, ThinkerOutput]):
    """Thinker on the tiny family's random Qwen2 LLM and audio encoder."""

    name = "thinker"

    async def start(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self.torch = TorchThread(self.name)
        self.engine = await VllmEngine.start(engine_settings(ctx, "thinker"))
        self.prompts = await self.torch.run(ThinkerPromptBuilder.load, part_dir(ctx, "thinker"),
                                            self.engine.tokenizer)
        self.max_model_len = self.engine.settings.max_model_len

    async def stream(self, job: ThinkerJob) -> AsyncIterator[ThinkerOutput]:
        if job.recite is not None:
            async for output in self._recite(job, job.recite):
                yield output
            return
        prompt = await self.torch.run(self._prompt_of, job)
        budget = reply_budget(len(prompt), job.max_tokens, self.max_model_len)
        deltas = self.engine.generate(job.request_id, prompt, self._sampling(job, budget))
        async with aclosing(deltas):
            async for delta in deltas:
                yield ThinkerOutput(job.request_id, text=delta.text, token_ids=delta.token_ids,
                                    embeds=await self._embeds(job, delta.token_ids),
                                    finished=delta.finished,
                                    finish_reason=delta.finish_reason,
                                    prompt_tokens=len(prompt),
                                    cached_tokens=delta.cached_tokens)

    async def _recite(self, job: ThinkerJob, text: str) -> AsyncIterator[ThinkerOutput]:
        """The given text as the reply: its tokens' embeddings are what the model's own
        tokens would carry (no engine request: the weights are not asked what to say)."""
        for piece, token_ids in recited_pieces(self.prompts.tokenizer, text):
            yield ThinkerOutput(job.request_id, text=piece, token_ids=token_ids,
                                embeds=await self._embeds(job, token_ids))
        yield ThinkerOutput(job.request_id, finished=True, finish_reason="stop")

    async def _embeds(self, job: ThinkerJob, token_ids: list[int]) -> list[TensorRef]:
        """The tokens' embeddings in a pool block sent on, when the job wants them: one
        delta's few rows, which one block holds (no prompt rows: this family sends none)."""
        if not token_ids or not job.embeds:
            return []
        rows = (len(token_ids), self.prompts.hidden)
        with await self.ctx.acquire_tensor(rows, "float32") as lease:
            # A few rows: microseconds, so on the loop, not the torch thread.
            self.prompts.embed_into(token_ids, lease.tensor())
            return [lease.send()]

    def _prompt_of(self, job: ThinkerJob) -> torch.Tensor:
        """The job's prompt, its audio read in place (released once the prompt is built: the
        prompt is a new tensor); in the torch thread."""
        if job.audio is None:
            return self._prompt(job, None)
        with self.ctx.read_tensors([job.audio]) as audio:
            assert isinstance(audio, np.ndarray)  # blocks alone are read as a numpy view
            return self._prompt(job, audio)

    def _prompt(self, job: ThinkerJob, audio: np.ndarray | None) -> torch.Tensor:
        """The prompt embeddings; the oldest turns go when the history is too long."""
        fitted = fit_history(list(job.messages), lambda m: len(self.prompts.build(m, audio)),
                             job.max_tokens, self.max_model_len,
                             keep=0 if audio is not None else 1, truncation=job.truncation)
        return self.prompts.build(fitted, audio)

    def _sampling(self, job: ThinkerJob, max_tokens: int) -> Sampling:
        settings = self.ctx.settings
        schema = json_schema_of(job.response_format) if job.response_format else None
        return with_options(Sampling(
            max_tokens=max_tokens,
            temperature=float(settings.get("temperature", 0.0)),
            seed=settings.get("seed"),
            # Random weights never choose EOS on purpose: a fixed length keeps tests exact.
            # Guided JSON must stop when the object closes, so EOS counts there.
            ignore_eos=bool(settings.get("ignore_eos", True)) and schema is None,
            json_schema=schema,
        ), job.sampling)
