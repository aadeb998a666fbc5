"""The qwen3_omni family's Talker stage: the Thinker's rows to 16-codebook frames.

The talker's LM runs on stock vLLM as a pooling model (docs/decisions/qwen3-omni-talker-on-vllm.md;
the build writes it as talker_lm/): each frame is one pooling request over the turn's history
of input rows, which hands back the final-norm state of its last row. This worker does the
rest of the reference's step (`talker_frames.py`): codebook 0 from the codec head, codebooks
1-15 from the code predictor, the frame's input row. The frames of every turn waiting at the
same moment are made in one batch in the torch thread, and every call's pooling requests
batch in the one engine.

A turn's Talker jobs are its chunks, in order: request ids `call/turn/talker/<chunk>` share
the turn's state (`TalkerTurn`), so each chunk's reply rows continue the same frames. The
first chunk carries the Thinker's prompt part (`TalkerJob.prompt_rows`), the last says the
reply text ended (`TalkerJob.last`; the profiles set `cascade.closing_chunk`, which always
sends it). An output's `tokens` are whole frames, 16 codes each (codebook 0 to 15); the
groups count codes as every family's do (`TalkerJob.first_group`, then each twice the one
before, up to `group`), each ending at the first whole frame that fills it: a first group of
4 codes is the first frame, handed on the moment it is made. abort() ends a job's turn: no
frame starts after it, and the pooling request in flight is aborted in vLLM.

Settings: `talker_lm` (a converted directory; default the built family's), `release` (the
code predictor, codec head and projections; default the built family's), `device`/`dtype`
(where the torch parts run: `torch_placement`), the reference's sampling `temperature`,
`top_k`, `top_p`, `repetition_penalty`, the code predictor's `predictor_top_k` and
`predictor_top_p`, `greedy` (both greedy: parity checks), `max_frames` (a reply's frames at
most: random weights never say their end of speech), `seed`, `max_batch`, and `engine`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import torch

from pipeline.engines.vllm import LAST_STATE_POOLING, EngineSettings, VllmEngine
from pipeline.families.kit.engine_stage import ENGINE_DEFAULTS, EngineStage
from pipeline.families.kit.release_build import release_dir
from pipeline.families.kit.talker_chunks import ChunkInfo, chunk_info, chunk_rows, feed_chunk
from pipeline.families.kit.torch_placement import Placement
from pipeline.families.kit.torch_thread import TorchThread
from pipeline.families.kit.turn_states import keep_newest
from pipeline.families.qwen3_omni.build import FAMILY, TALKER_LM
from pipeline.families.qwen3_omni.code_predictor import Pick
from pipeline.families.qwen3_omni.talker_frames import (
    GREEDY_FRAMES,
    MAX_BATCH,
    PREDICTOR_SAMPLING,
    TALKER_SAMPLING,
    FrameSampling,
    TalkerParts,
    TalkerTurn,
    batched_frames,
    speak,
)
from pipeline.stage import StageContext, TalkerJob, TalkerOutput

MAX_TURNS = 256  # turns whose state is kept between chunks at most (oldest dropped)
DEFAULT_VOICE = "ethan"  # the release's speaker for the voice "default"


class Qwen3OmniTalker(EngineStage[TalkerJob, TalkerOutput]):
    """Talker on Qwen3-Omni's talker LM (pooling, on stock vLLM) and its code predictor."""

    name = "talker"

    async def start(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self.torch = TorchThread(self.name)
        family = Path(ctx.models_dir) / FAMILY
        model = Path(ctx.settings.get("talker_lm") or family / TALKER_LM)
        release = Path(ctx.settings.get("release") or release_dir(family))
        settings = {**ENGINE_DEFAULTS, "skip_tokenizer_init": True, **LAST_STATE_POOLING,
                    **ctx.settings.get("engine", {}), "model": str(model)}
        self.engine = await VllmEngine.start(EngineSettings.from_mapping(settings))
        placement = Placement.of(ctx.settings)
        self.parts = await self.torch.run(TalkerParts.load, release, placement.device,
                                          placement.dtype)
        self.frames = batched_frames(self.torch, self.parts,
                                     int(ctx.settings.get("max_batch", MAX_BATCH)))
        self.sampling = frame_sampling(ctx.settings)
        self.turns: dict[str, TalkerTurn] = {}  # by ChunkInfo.turn, oldest first
        self.jobs: dict[str, TalkerTurn] = {}  # job request id -> its turn, while it runs
        self.steps: dict[str, str] = {}  # job request id -> its pooling request in flight
        self._step_ids = itertools.count()

    async def stream(self, job: TalkerJob) -> AsyncIterator[TalkerOutput]:
        """Voice one chunk of a turn: feed its rows to the turn, then make frames while they
        last."""
        rid, pending, info = job.request_id, [], chunk_info(job)
        # the job's blocks are released by now
        rows = await self.torch.run(chunk_rows, self.ctx, job)
        turn = self._turn(info, job.voice)
        size = max(1, job.first_group)
        self.jobs[rid] = turn
        try:
            feed_chunk(turn, info, rows)
            async with aclosing(speak(turn, lambda history: self._pool(rid, history),
                                      self.frames)) as frames:
                async for codes in frames:
                    pending.extend(codes)
                    if len(pending) >= size:
                        yield TalkerOutput(rid, tokens=pending)
                        pending, size = [], job.next_group(size)
        finally:
            del self.jobs[rid]
            if info.last or turn.aborted:  # a turn whose speech ended early stays: its later
                self.turns.pop(info.turn, None)  # chunks say nothing, as in the reference
        reason = "abort" if turn.aborted else "stop"
        yield TalkerOutput(rid, tokens=pending, finished=True, finish_reason=reason)

    async def _pool(self, rid: str, history: torch.Tensor) -> torch.Tensor:
        """The talker LM's state at the history's last row: one pooling request."""
        step = f"{rid}/{next(self._step_ids)}"
        self.steps[rid] = step
        try:
            pooled = await self.engine.pooled(step, history)
        finally:
            self.steps.pop(rid, None)
        if pooled is None:  # aborted in vLLM: the turn ends
            self.jobs[rid].abort()
            return torch.zeros(history.shape[1])
        return pooled.state

    async def abort(self, request_ids: list[str]) -> None:
        """End these jobs' turns: no further frame starts, the request in flight is aborted."""
        steps = []
        for rid in request_ids:
            if (turn := self.jobs.get(rid)) is not None:
                turn.abort()
            if (step := self.steps.get(rid)) is not None:
                steps.append(step)
        await self.engine.abort(steps)

    def _turn(self, info: ChunkInfo, voice: str) -> TalkerTurn:
        """The job's turn: a new one for a first chunk (or one whose turn state is gone)."""
        turn = self.turns.get(info.turn)
        if turn is None or info.index == 0:
            turn = TalkerTurn(self.parts, DEFAULT_VOICE if voice == "default" else voice,
                              self.sampling)
            keep_newest(self.turns, info.turn, turn, MAX_TURNS)  # turns cancelled between chunks
        return turn


def frame_sampling(settings: dict[str, Any]) -> FrameSampling:
    """The stage settings' sampling (the reference generate()'s by default)."""
    if settings.get("greedy"):
        return dataclasses.replace(GREEDY_FRAMES, **_limits(settings))
    talker = Pick(greedy=False, temperature=float(settings.get("temperature",
                                                               TALKER_SAMPLING.temperature)),
                  top_k=int(settings.get("top_k", TALKER_SAMPLING.top_k)),
                  top_p=float(settings.get("top_p", TALKER_SAMPLING.top_p)))
    predictor = dataclasses.replace(
        PREDICTOR_SAMPLING, top_k=int(settings.get("predictor_top_k", PREDICTOR_SAMPLING.top_k)),
        top_p=float(settings.get("predictor_top_p", PREDICTOR_SAMPLING.top_p)))
    penalty = float(settings.get("repetition_penalty", FrameSampling.repetition_penalty))
    return FrameSampling(talker=talker, repetition_penalty=penalty, predictor=predictor,
                         **_limits(settings))


def _limits(settings: dict[str, Any]) -> dict[str, Any]:
    seed = settings.get("seed")
    return {"max_frames": int(settings.get("max_frames", FrameSampling.max_frames)),
            "seed": None if seed is None else int(seed)}
