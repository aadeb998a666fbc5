"""The qwen25_omni family's Talker stage: Thinker rows to speech codes on one vLLM engine.

The release's talker is converted once, at the stage's first start (talker_lm.py), and driven
by the two-phase method (talker_steps.py). A turn's Talker jobs are its chunks, in order:
request ids `call/turn/talker/<chunk>` share the turn's state (`TalkerTurn`), so each chunk's
reply rows continue the same codec sequence. Codes are handed on in groups (`first_group`,
then `group`). Many turns' step requests batch in the one engine; abort() ends the job's
step in flight and every step after it.

Each job says how many leading rows of its embeddings are the Thinker's prompt part
(`TalkerJob.prompt_rows`: the first chunk's) and whether the reply text ends with it
(`TalkerJob.last`; such a job may carry no text, only a stop token's row, or nothing). The
family's profiles therefore set `cascade.closing_chunk`, which marks and always sends the last
job: without it, a turn's codes would never reach their free-running end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path

from pipeline.engines.vllm import EngineSettings, VllmEngine
from pipeline.families.kit.engine_stage import ENGINE_DEFAULTS, EngineStage
from pipeline.families.kit.release_build import release_dir
from pipeline.families.kit.talker_chunks import ChunkInfo, chunk_info, chunk_rows, feed_chunk
from pipeline.families.kit.torch_thread import TorchThread
from pipeline.families.kit.turn_states import keep_newest
from pipeline.families.qwen25_omni.build import FAMILY
from pipeline.families.qwen25_omni.release import speaker_for
from pipeline.families.qwen25_omni.talker_lm import (
    LM_DIR,
    TalkerExtras,
    convert_talker,
    load_lm_embedding,
)
from pipeline.families.qwen25_omni.talker_steps import StepSampling, TalkerTurn, speak
from pipeline.stage import StageContext, TalkerJob, TalkerOutput

MAX_TURNS = 256  # turns whose state is kept between chunks at most (oldest dropped)


def lm_dir(ctx: StageContext) -> Path:
    """The converted talker: setting `talker_lm`, else the built family's talker_lm/, converted
    here from the family's release when the build has not written it."""
    if ctx.settings.get("talker_lm"):
        return Path(ctx.settings["talker_lm"])
    family = Path(ctx.models_dir) / FAMILY
    out = family / LM_DIR
    if not (out / "config.json").is_file():
        convert_talker(release_dir(family), out)
    return out


class OmniTalker(EngineStage[TalkerJob, TalkerOutput]):
    """Talker on Qwen2.5-Omni's talker, converted, on stock vLLM."""

    name = "talker"

    async def start(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self.torch = TorchThread(self.name)
        directory = await self.torch.run(lm_dir, ctx)
        settings = {**ENGINE_DEFAULTS, "skip_tokenizer_init": True,
                    **ctx.settings.get("engine", {}), "model": str(directory)}
        self.engine = await VllmEngine.start(EngineSettings.from_mapping(settings))
        self.extras = await self.torch.run(TalkerExtras.load, directory)
        self.embedding = await self.torch.run(load_lm_embedding, directory)
        self.sampling = StepSampling(  # the reference's defaults (its top_k 40 and repetition
            temperature=float(ctx.settings.get("temperature", 0.9)),  # penalty 1.05: not yet)
            top_p=float(ctx.settings.get("top_p", 0.8)),
            max_codes=int(ctx.settings.get("max_codes", StepSampling.max_codes)))
        self.turns: dict[str, TalkerTurn] = {}  # by ChunkInfo.turn, oldest first
        self.jobs: dict[str, TalkerTurn] = {}  # job request id -> its turn, while it runs

    def stream(self, job: TalkerJob) -> AsyncIterator[TalkerOutput]:
        return self.stream_chunk(job, chunk_info(job))

    async def stream_chunk(self, job: TalkerJob, info: ChunkInfo) -> AsyncIterator[TalkerOutput]:
        """Voice one chunk of a turn: feed its rows to the turn, then step while they last."""
        rid, pending = job.request_id, []
        # the job's blocks are released by now
        rows = await self.torch.run(chunk_rows, self.ctx, job)
        turn = self._turn(info, self._voice(job.voice))
        size = max(1, job.first_group)
        self.jobs[rid] = turn
        try:
            await self.torch.run(feed_chunk, turn, info, rows)
            async with aclosing(speak(turn, self.engine, rid, self.sampling)) as codes:
                async for code in codes:
                    pending.append(code)
                    if len(pending) >= size:
                        yield TalkerOutput(rid, tokens=pending)
                        pending, size = [], job.next_group(size)
        finally:
            del self.jobs[rid]
            if info.last or turn.aborted:  # a turn whose speech ended early stays: its
                self.turns.pop(info.turn, None)  # later chunks say nothing, as in the reference
        reason = "abort" if turn.aborted else "stop"
        yield TalkerOutput(rid, tokens=pending, finished=True, finish_reason=reason)

    async def abort(self, request_ids: list[str]) -> None:
        """End these jobs: no further step starts, and the step in flight is aborted."""
        steps = []
        for rid in request_ids:
            if (turn := self.jobs.get(rid)) is not None:
                turn.abort()
                steps.extend([turn.step_id] if turn.step_id else [])
        await self.engine.abort(steps)

    def _turn(self, info: ChunkInfo, voice: str) -> TalkerTurn:
        """The job's turn: a new one for a first chunk (or one whose turn state is gone)."""
        turn = self.turns.get(info.turn)
        if turn is None or info.index == 0:
            turn = TalkerTurn(self.extras, self.embedding, voice)
            keep_newest(self.turns, info.turn, turn, MAX_TURNS)  # turns cancelled between chunks
        return turn

    def _voice(self, voice: str) -> str:
        """The release's speaker for a job's voice, chosen as the VoiceBox chooses it."""
        return speaker_for(voice, list(self.extras.text_bos))
