"""The tiny family's Talker stage: Thinker text embeddings to speech tokens, on vLLM.

Each job is one vLLM request whose prompt_embeds are [speaker, projected text embeddings,
the turn's audio context]. It speaks `tokens_per_char` speech tokens per character of text
(bounded), handed on in groups: a small first group for a fast start, then `job.group`.
This stage reads `job.text_embeds` in place (`ctx.read_tensors`): the projection reads the
blocks' views, and the blocks are released once the prompt is built.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import torch

from pipeline.engines.vllm import Sampling, VllmEngine
from pipeline.families.kit.engine_stage import EngineStage
from pipeline.families.kit.torch_thread import TorchThread
from pipeline.families.tiny.stage_support import engine_settings, part_dir
from pipeline.families.tiny.talker_prompt import TalkerPromptBuilder
from pipeline.stage import StageContext, TalkerJob, TalkerOutput

TOKENS_PER_CHAR = 3
MIN_TOKENS = 4
MAX_TOKENS = 256
MAX_CONTEXT = 256  # audio context kept from the turn (its last tokens)


class TinyTalker(EngineStage[TalkerJob, TalkerOutput]):
    """Talker on the tiny family's random Qwen2 decoder over 256 speech codes."""

    name = "talker"

    async def start(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self.torch = TorchThread(self.name)
        self.engine = await VllmEngine.start(
            engine_settings(ctx, "talker", skip_tokenizer_init=True))
        self.prompts = await self.torch.run(TalkerPromptBuilder, part_dir(ctx, "talker"))
        self.codes = list(range(self.prompts.n_codes))  # never sample the special tokens

    def speech_tokens_for(self, text: str) -> int:
        """How many speech tokens a chunk of text is spoken with."""
        per_char = int(self.ctx.settings.get("tokens_per_char", TOKENS_PER_CHAR))
        upper = int(self.ctx.settings.get("max_tokens", MAX_TOKENS))
        return max(MIN_TOKENS, min(upper, per_char * len(text)))

    async def stream(self, job: TalkerJob) -> AsyncIterator[TalkerOutput]:
        n_tokens = self.speech_tokens_for(job.text)
        prompt = await self.torch.run(self._prompt, job, n_tokens)
        sampling = Sampling(max_tokens=n_tokens, ignore_eos=True, allowed_token_ids=self.codes,
                            temperature=float(self.ctx.settings.get("temperature", 0.8)),
                            seed=int(self.ctx.settings.get("seed", 0)), detokenize=False)
        pending: list[int] = []
        size = max(1, job.first_group)
        deltas = self.engine.generate(job.request_id, prompt, sampling)
        async with aclosing(deltas):
            async for delta in deltas:
                pending.extend(delta.token_ids)
                while len(pending) >= size and not delta.finished:
                    yield TalkerOutput(job.request_id, tokens=pending[:size])
                    pending, size = pending[size:], job.next_group(size)
                if delta.finished:
                    yield TalkerOutput(job.request_id, tokens=pending, finished=True,
                                       finish_reason=delta.finish_reason)

    def _prompt(self, job: TalkerJob, n_tokens: int) -> torch.Tensor:
        """Build the prompt from the text embeddings read in place, then release their blocks
        (the prompt is a new tensor: nothing of it points into them); in the torch thread."""
        if not job.text_embeds:
            raise ValueError(f"{job.request_id}: the tiny Talker speaks from text_embeds, "
                             f"and this job has none")
        with self.ctx.read_tensors(job.text_embeds) as embeds:
            text = torch.as_tensor(embeds, device=self.prompts.projection_w.device)  # a view
            room = self.engine.settings.max_model_len - 1 - len(text) - n_tokens
            if room < 0:
                raise ValueError(f"{job.request_id}: {len(text)} text embeddings plus "
                                 f"{n_tokens} speech tokens exceed max_model_len")
            max_context = min(room, int(self.ctx.settings.get("max_context", MAX_CONTEXT)))
            return self.prompts.build(text, job.context_tokens, job.voice, max_context)
