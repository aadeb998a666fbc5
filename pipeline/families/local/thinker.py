"""The local family's Thinker stage: Whisper tiny.en hears, SmolLM2-135M-Instruct answers.

A job with audio is transcribed first (in the stage's recognizer thread) and the transcript is
yielded before anything else (a `transcribe` job ends there); it then joins the history as the
new user message. The chat-templated history goes to vLLM as token ids and the reply streams
back as text deltas. Greedy decoding by default: a 135M model rambles when sampled. Replies
carry no embeddings (the local Talker speaks from text). Block ownership: this stage reads
`job.audio` in place and releases it once heard.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from pipeline.engines.vllm import EngineSettings, Sampling, VllmEngine, json_schema_of
from pipeline.families.kit.caller_words import recognizer_dir
from pipeline.families.kit.context_window import fit_history, reply_budget
from pipeline.families.kit.end_of_turn import end_of_turn_prompt, probability
from pipeline.families.kit.recite import recited_pieces
from pipeline.families.kit.request_sampling import with_options
from pipeline.families.kit.speech_recognizer import (
    Heard,
    RecognizerSettings,
    SpeechRecognizer,
)
from pipeline.families.kit.work_thread import WorkThread
from pipeline.families.local.build import ASR_DIR, LLM_DIR
from pipeline.families.local.stage_support import family_dir
from pipeline.stage import Stage, StageContext, ThinkerJob, ThinkerOutput
from pipeline.tensors.shm import BlockRef

logger = logging.getLogger(__name__)

ENGINE_DEFAULTS: dict[str, Any] = {
    "dtype": "float32",  # bfloat16 was no faster on the development CPUs
    "max_model_len": 2048,
    "kv_cache_memory_bytes": 256 * 2**20,
    "enforce_eager": True,
    "max_num_seqs": 16,
    # The prefix cache's grain: vLLM's CPU default of 128 tokens left up to 127 tokens of the
    # history, its last partial block, to prefill again every turn (first token 487 -> 204 ms
    # after the words were heard); the CPU attention takes multiples of 32.
    "block_size": 32,
}
# Used only when the history has no system message (SmolLM2's template would add its own).
DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful voice assistant. Your replies are spoken aloud, so answer in one or two "
    "short, plain sentences. Never use markdown, lists or emoji. Write numbers as words.")
# Worked exchanges put after the system message, before the conversation: a 135M model copies
# their short, direct form far better than it follows a prompt (`omnivox bench answers`, typed:
# 54% right without them, 74% with these; docs/measurements/2026-12-01-answers.md). None of
# them is a question of that set.
DEFAULT_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("Hi there!", "Hello! How can I help you?"),
    ("How is it going?", "I am doing well, thank you!"),
    ("What is the capital of Canada?", "The capital of Canada is Ottawa."),
    ("Is sugar sweet?", "Yes, sugar is sweet."),
    ("What is three plus four?", "Three plus four is seven."),
    ("What is six times two?", "Six times two is twelve."),
    ("Is a stone soft?", "No, a stone is hard."),
    ("Which animal says quack?", "A duck says quack."),
    ("What colour is a tomato?", "A ripe tomato is red."),
    ("Is milk white?", "Yes, milk is white."),
)

# Said instead of an answer when the recognizer is unsure of the caller's words: its mean token
# log-probability below ASK_AGAIN_BELOW (`omnivox bench asr`'s asking-again table;
# docs/measurements/2026-12-02-asking-again.md). A misheard question answered is worse than a
# question asked twice.
ASK_AGAIN = "Sorry, I did not catch that. Could you say it again?"
ASK_AGAIN_BELOW = -0.65


class LocalThinker(Stage[ThinkerJob, ThinkerOutput]):
    """Thinker on Whisper tiny.en (CTranslate2) and SmolLM2-135M-Instruct (vLLM)."""

    name = "thinker"

    def __init__(self, chat_model: Path | None = None) -> None:
        """`chat_model`: another vLLM chat model directory to answer with than the built
        family's (orpheus runs this Thinker so, through the families registry, on a real
        checkpoint's thinker/); the recogniser is then the `asr_dir` setting's, else the
        packaged tiny.en, and no worked examples are put before the conversation unless the
        profile gives them (ours are for SmolLM2-135M)."""
        self.chat_model = chat_model
        # Worked examples put before the conversation unless the profile gives its own.
        self.default_examples: tuple[tuple[str, str], ...] = (
            DEFAULT_EXAMPLES if chat_model is None else ())

    def model_dirs(self, ctx: StageContext) -> tuple[Path, Path]:
        """(recognizer, chat model) directories: the built family's, or the chat model's
        with the recogniser `recognizer_dir` names."""
        if self.chat_model is not None:
            return recognizer_dir(ctx.settings), self.chat_model
        root = family_dir(ctx)
        return root / ASR_DIR, root / LLM_DIR

    async def start(self, ctx: StageContext) -> None:
        self.ctx = ctx
        asr_dir, llm_dir = self.model_dirs(ctx)
        self.hearing = WorkThread("asr")
        self.prompting = WorkThread("prompt")
        engine = EngineSettings.from_mapping(
            {**ENGINE_DEFAULTS, **ctx.settings.get("engine", {}), "model": str(llm_dir)})
        recognizer = RecognizerSettings(**ctx.settings.get("asr", {}))
        self.recognizer, self.engine = await asyncio.gather(
            self.hearing.run(SpeechRecognizer, asr_dir, recognizer),
            VllmEngine.start(engine))
        await self.engine.warm_up_logprobs()  # the caller's words are scored at pauses
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.settings.max_model_len
        self.system_prompt = str(ctx.settings.get("system_prompt", DEFAULT_SYSTEM_PROMPT))
        self.examples = [{"role": role, "content": str(text)}
                         for pair in ctx.settings.get("examples", self.default_examples)
                         for role, text in zip(("user", "assistant"), pair, strict=True)]
        self.ask_again = str(ctx.settings.get("ask_again", ASK_AGAIN))
        self.ask_again_below = float(ctx.settings.get("ask_again_below", ASK_AGAIN_BELOW))
        self.preparing: set[str] = set()  # requests not yet in the engine (hearing, prompting)
        self.aborted: set[str] = set()  # of those, the ones aborted meanwhile

    async def stream(self, job: ThinkerJob) -> AsyncIterator[ThinkerOutput]:
        rid = job.request_id
        if job.recite is not None:  # the given text as the reply: nothing to hear or write
            for output in self._recited(rid, job.recite):
                yield output
            return
        self.preparing.add(rid)
        heard: ThinkerOutput | None = None  # the transcript, when its score is still to come
        scored: tuple[list[int], int] | None = None  # the end-of-turn score's prompt
        try:
            messages = list(job.messages)
            if job.audio is not None:
                words = await self.hearing.run(self._hear, job.audio, messages)
                transcript = words.text
                heard = ThinkerOutput(rid, transcript=transcript)
                if job.score_end_of_turn and transcript:
                    scored = await self.prompting.run(self._end_of_turn_ids, messages,
                                                      transcript)
                answers = transcript and not job.transcribe
                if not answers or words.mean_log_prob < self.ask_again_below:
                    yield await self._scored(rid, heard, scored)
                    if not answers:
                        reason = "stop" if transcript else "no_speech"
                        yield ThinkerOutput(rid, finished=True, finish_reason=reason)
                        return
                    logger.info("%s: unsure of %r (mean log-probability %.2f): asking again",
                                rid, transcript, words.mean_log_prob)
                    for output in self._recited(rid, self.ask_again):
                        yield output
                    return
                if scored is None:  # nothing to wait for: the caller's words go out at once
                    yield heard
                    heard = None
                messages.append({"role": "user", "content": transcript})
            prompt = await self.prompting.run(self.prompt_ids, messages, job.max_tokens,
                                              job.truncation)
            if rid in self.aborted:
                if heard is not None:  # the caller's words are kept, unscored
                    yield heard
                yield ThinkerOutput(rid, finished=True, finish_reason="abort")
                return
        finally:
            self.preparing.discard(rid)
            self.aborted.discard(rid)
        sampling = self._sampling(job, reply_budget(len(prompt), job.max_tokens,
                                                    self.max_model_len))
        scoring: asyncio.Future[ThinkerOutput] | None = None
        try:
            async with aclosing(self._reply(rid, prompt, sampling)) as replying:
                async for output in replying:
                    if heard is not None:
                        # The score is asked for once the reply's first token is out, so that
                        # it never delays it; the transcript goes out as soon as it is scored.
                        scoring = scoring or asyncio.ensure_future(
                            self._scored(rid, heard, scored))
                        if scoring.done() or output.finished:
                            yield await scoring
                            heard = None
                    yield output
        finally:
            if scoring is not None:
                scoring.cancel()  # the stream closed before the score was in

    async def _reply(self, rid: str, prompt: list[int], sampling: Sampling
                     ) -> AsyncGenerator[ThinkerOutput, None]:
        """The reply written on `prompt`, as the engine streams it."""
        async with aclosing(self.engine.generate(rid, prompt, sampling)) as deltas:
            async for delta in deltas:
                yield ThinkerOutput(rid, text=delta.text, token_ids=delta.token_ids,
                                    finished=delta.finished, finish_reason=delta.finish_reason,
                                    prompt_tokens=len(prompt), cached_tokens=delta.cached_tokens)

    async def _scored(self, rid: str, heard: ThinkerOutput,
                      scored: tuple[list[int], int] | None) -> ThinkerOutput:
        """The transcript output with the end-of-turn score of the `scored` prompt, if any:
        the probability the chat model gives the end of the caller's sentence or message after
        their words (pipeline/families/kit/end_of_turn.py), a reply's prompt before them."""
        if scored is None:
            return heard
        prompt, closing = scored
        logprobs = await self.engine.next_token_logprobs(f"{rid}-eot", prompt)
        return msgspec.structs.replace(
            heard, end_of_turn=probability(self.tokenizer, logprobs, closing))

    def _recited(self, rid: str, text: str) -> list[ThinkerOutput]:
        """`text` as a whole reply, in the pieces a generated one would come in."""
        return [*(ThinkerOutput(rid, text=piece, token_ids=token_ids)
                  for piece, token_ids in recited_pieces(self.tokenizer, text)),
                ThinkerOutput(rid, finished=True, finish_reason="stop")]

    def _hear(self, audio: BlockRef, messages: list[dict[str, str]]) -> Heard:
        """The caller's words, the audio read in place (its float conversion being its only
        copy) and released once heard; in the hearing thread. The conversation's lines so far
        (not the system prompt) are the recognizer's context."""
        context = [str(m.get("content", "")) for m in messages if m.get("role") != "system"]
        with self.ctx.read_tensors([audio]) as samples:
            assert isinstance(samples, np.ndarray)  # blocks alone are read as a numpy view
            return self.recognizer.hear(samples, context)

    def _end_of_turn_ids(self, messages: list[dict[str, str]],
                         words: str) -> tuple[list[int], int] | None:
        """The scored prompt: the oldest turns go, as for a reply, when it is too long."""
        said = [*self._with_examples(messages), {"role": "user", "content": words}]
        fitted = fit_history(said, lambda m: len(self._template_ids(m)), 1, self.max_model_len)
        return end_of_turn_prompt(self.tokenizer, fitted[:-1], words)

    def _with_examples(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        """The system message (the default one if none), the worked examples, the rest."""
        if not messages or messages[0].get("role") != "system":
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        return [messages[0], *self.examples, *messages[1:]]

    def prompt_ids(self, messages: list[dict[str, str]], max_tokens: int,
                   truncation: str | float = "auto") -> list[int]:
        """The chat-templated prompt's token ids, the examples after the system message; the
        oldest turns (the examples first) go when it is too long, as `truncation` says."""
        messages = self._with_examples(messages)
        fitted = fit_history(messages, lambda m: len(self._template_ids(m)), max_tokens,
                             self.max_model_len, truncation=truncation)
        return self._template_ids(fitted)

    def _template_ids(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                  tokenize=False)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    async def abort(self, request_ids: list[str]) -> None:
        """Abort in the engine; requests still being heard end before reaching it."""
        self.aborted.update(rid for rid in request_ids if rid in self.preparing)
        await self.engine.abort(request_ids)

    def active_request_ids(self) -> list[str]:
        return self.engine.active_request_ids()

    def failure(self) -> str | None:
        return self.engine.failure()

    async def stop(self) -> None:
        await self.engine.stop()
        self.hearing.close()
        self.prompting.close()

    def _sampling(self, job: ThinkerJob, max_tokens: int) -> Sampling:
        settings = self.ctx.settings
        return with_options(Sampling(
            max_tokens=max_tokens,
            temperature=float(settings.get("temperature", 0.0)),
            top_p=float(settings.get("top_p", 1.0)),
            seed=settings.get("seed"),
            json_schema=json_schema_of(job.response_format) if job.response_format else None,
        ), job.sampling)
