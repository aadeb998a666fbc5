"""A test-only model family: trivial deterministic stages, to test the stage runtime itself.

The thing under test is the runtime (processes, supervision, transport, cancel), not a model:
these stages do cheap, predictable work with the real pool and real worker processes.
Settings (per stage, from the profile) steer failures: `fail_start` (reason), `engine_child`
(spawn a long-lived child process, as a vLLM engine does), `hold_blocks` (pool blocks kept
while running), `start_delay_s` (a slow start), `token_s` (delay per output); the VoiceBox's
`lookahead_tokens` holds back a turn's last tokens while more follow (FakeVoiceBox).
A Thinker message containing "HANG" blocks the worker's event loop (a hung worker); one
containing "STALL" takes the request and never answers it until it is aborted (a stuck engine,
in a worker that still heartbeats). A job guided by a response_format answers with what its
last message says after "JSON:" (a scripted answer in place of a grammar's); a recited job says
the text it recites.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from pipeline.stage import (
    JobT,
    OutputT,
    Stage,
    StageContext,
    TalkerJob,
    TalkerOutput,
    ThinkerJob,
    ThinkerOutput,
    VoiceBoxJob,
    VoiceBoxOutput,
)
from pipeline.tensors.shm import BlockRef

WORDS = ("Hello", "there,", "this", "is", "a", "test", "reply.", "It", "has", "clauses,",
         "words", "and", "sentences;", "enough", "to", "cut", "chunks.")
HIDDEN = 8
FAKE_PIPELINE = {  # the pipeline settings of a server on this family
    "family": "tests.fake_family",
    "pool": {"block_count": 32, "block_size": 1 << 20},
    "restart": {"heartbeat_s": 0.1, "heartbeat_timeout_s": 10.0},
}
SAMPLE_RATE = 16_000
SAMPLES_PER_TOKEN = 160


def reply_words(n: int) -> list[str]:
    """The fake Thinker's reply: n words, deterministic."""
    return [WORDS[i % len(WORDS)] for i in range(n)]


class _FakeStage(Stage[JobT, OutputT]):
    """Shared plumbing: settings, the request ids this fake 'engine' holds, abort."""

    def __init__(self) -> None:
        self.active: dict[str, asyncio.Event] = {}  # request id -> aborted
        self.child: subprocess.Popen[bytes] | None = None

    async def start(self, ctx: StageContext) -> None:
        self.ctx, self.pool, self.settings = ctx, ctx.pool, ctx.settings
        await asyncio.sleep(self.settings.get("start_delay_s", 0.0))  # as a slow engine load
        if reason := self.settings.get("fail_start"):
            raise RuntimeError(reason)
        # Blocks this 'engine' keeps for its lifetime: only a reclaim frees them if it dies.
        self.kept = [await ctx.pool.put(np.zeros(16, np.float32), 1.0)
                     for _ in range(self.settings.get("hold_blocks", 0))]
        if self.settings.get("engine_child"):
            self.child = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(3600)"])

    async def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            if rid in self.active:
                self.active[rid].set()

    def active_request_ids(self) -> list[str]:
        return list(self.active)

    async def stop(self) -> None:
        if self.child is not None:
            self.child.kill()
            self.child.wait()

    async def _steps(self, rid: str, n: int) -> AsyncIterator[int]:
        """Yield 0..n-1 at the configured pace while the request is not aborted."""
        aborted = self.active[rid] = asyncio.Event()
        try:
            for i in range(n):
                if aborted.is_set():
                    return
                await asyncio.sleep(self.settings.get("token_s", 0.0))
                yield i
        finally:
            del self.active[rid]


class FakeThinker(_FakeStage[ThinkerJob, ThinkerOutput]):
    name = "thinker"

    async def stream(self, job: ThinkerJob) -> AsyncIterator[ThinkerOutput]:
        if any("HANG" in m["content"] for m in job.messages):
            time.sleep(3600)  # blocks the event loop on purpose: heartbeats stop
        if any("STALL" in m["content"] for m in job.messages):
            aborted = self.active[job.request_id] = asyncio.Event()
            try:
                await aborted.wait()  # held as an engine holds a request, never answered
            finally:
                del self.active[job.request_id]
            yield ThinkerOutput(job.request_id, finished=True, finish_reason="abort")
            return
        if job.audio is not None:
            samples = self.pool.view(job.audio)
            yield ThinkerOutput(job.request_id, transcript=f"<{len(samples)} samples>")
        words = self._words(job)
        async for i in self._steps(job.request_id, len(words)):
            embeds = await self.ctx.send_rows(np.full((1, HIDDEN), i, np.float32))
            text = words[i] if i == 0 else " " + words[i]
            yield ThinkerOutput(job.request_id, text=text, token_ids=[i], embeds=embeds)
        yield ThinkerOutput(job.request_id, finished=True, finish_reason="length")


    @staticmethod
    def _words(job: ThinkerJob) -> list[str]:
        if job.recite is not None:
            return job.recite.split(" ")
        scripted = job.messages[-1]["content"].partition("JSON:")[2] if job.messages else ""
        if job.response_format is not None and scripted:
            return scripted.split(" ")
        return reply_words(job.max_tokens)


class FakeTalker(_FakeStage[TalkerJob, TalkerOutput]):
    name = "talker"

    async def stream(self, job: TalkerJob) -> AsyncIterator[TalkerOutput]:
        for piece in job.text_embeds:  # read, not taken: the API process releases its blocks
            assert isinstance(piece, BlockRef)  # no CUDA IPC here: blocks alone
            assert self.pool.view(piece).shape[1] == HIDDEN
        async for output in self.speak(job, [ord(c) for c in job.text]):
            yield output

    async def speak(self, job: TalkerJob, tokens: list[int]) -> AsyncIterator[TalkerOutput]:
        """`tokens` as the job's groups (a smaller first one), one step apart."""
        size, group = job.first_group, []
        async for i in self._steps(job.request_id, len(tokens)):
            group.append(tokens[i])
            if len(group) == size:
                yield TalkerOutput(job.request_id, tokens=group)
                size, group = job.group, []
        yield TalkerOutput(job.request_id, tokens=group, finished=True, finish_reason="stop")


class FakeVoiceBox(_FakeStage[VoiceBoxJob, VoiceBoxOutput]):
    """Voices each token as SAMPLES_PER_TOKEN samples of its value. With the setting
    `lookahead_tokens`, a job whose turn has `more` to follow holds back the turn's last ones
    for its next job, as a VoiceBox rendering with lookahead does; the job that ends the turn
    voices them. A job with nothing to voice yields no PCM."""

    name = "voicebox"

    async def start(self, ctx: StageContext) -> None:
        await super().start(ctx)
        self.held: dict[str, list[int]] = {}  # turn (request id up to its last "/") -> tokens

    async def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.held.pop(rid.rpartition("/")[0], None)
        await super().abort(request_ids)

    async def stream(self, job: VoiceBoxJob) -> AsyncIterator[VoiceBoxOutput]:
        tokens = self._voiced(job)
        async for _ in self._steps(job.request_id, 1):
            if tokens:
                pcm = np.repeat(np.asarray(tokens, np.int16), SAMPLES_PER_TOKEN)
                ref = await self.pool.put(pcm, 1.0)
                yield VoiceBoxOutput(job.request_id, pcm=ref, sample_rate=SAMPLE_RATE)
        yield VoiceBoxOutput(job.request_id, finished=True)

    def _voiced(self, job: VoiceBoxJob) -> list[int]:
        """The tokens this job voices: its turn's held ones and its own, less those it holds."""
        turn = job.request_id.rpartition("/")[0]
        tokens = self.held.pop(turn, []) + list(job.tokens)
        keep = min(len(tokens), int(self.settings.get("lookahead_tokens", 0))) if job.more else 0
        if keep:
            self.held[turn] = tokens[len(tokens) - keep:]
        return tokens[:len(tokens) - keep]


STAGES: dict[str, Any] = {"thinker": FakeThinker, "talker": FakeTalker, "voicebox": FakeVoiceBox}
