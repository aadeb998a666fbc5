"""The orpheus Talker stage: a chunk of reply text to SNAC decode windows, on vLLM.

Each job is one vLLM request whose prompt is the Orpheus prompt ids of the job's text, sampled
as the reference samples (temperature 0.6, top_p 0.8, repetition penalty 1.3, stop on end of
speech). The audio ids stream into whole frames of codes, cut into decode windows (first one
after the first frame); each window is one output, so the VoiceBox voices it as it comes.

Random-weight checkpoints set `audio_ids_only`: sampling keeps to the audio ids, which never
stop the request, so it runs to `max_tokens`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from pipeline.engines.vllm import Sampling, VllmEngine
from pipeline.families.kit.engine_stage import EngineStage
from pipeline.families.kit.torch_thread import TorchThread
from pipeline.families.orpheus.codes import AUDIO_IDS, FRAME, FrameAssembler
from pipeline.families.orpheus.prompt import DEFAULT_VOICE, END_OF_SPEECH, PromptBuilder
from pipeline.families.orpheus.stage_support import model_dir, talker_engine
from pipeline.families.orpheus.windows import WindowCutter
from pipeline.stage import StageContext, TalkerJob, TalkerOutput

MAX_TOKENS = 1200  # the reference's default per utterance


class OrpheusTalker(EngineStage[TalkerJob, TalkerOutput]):
    """Talker on an Orpheus Llama (any checkpoint with Orpheus's vocabulary layout)."""

    name = "talker"

    async def start(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self.torch = TorchThread(self.name)
        self.engine = await VllmEngine.start(talker_engine(ctx))
        self.prompts = await self.torch.run(PromptBuilder.load, model_dir(ctx, "talker"))
        settings = ctx.settings
        allowed = list(AUDIO_IDS) if settings.get("audio_ids_only") else None
        self.sampling = Sampling(
            max_tokens=int(settings.get("max_tokens", MAX_TOKENS)),
            temperature=float(settings.get("temperature", 0.6)),
            top_p=float(settings.get("top_p", 0.8)),
            repetition_penalty=float(settings.get("repetition_penalty", 1.3)),
            stop_token_ids=[END_OF_SPEECH], allowed_token_ids=allowed,
            seed=settings.get("seed"), detokenize=False)
        self.voice = str(settings.get("voice", DEFAULT_VOICE))

    def prompt(self, job: TalkerJob) -> list[int]:
        """The job's prompt ids, in the stage's voice unless the job names its own."""
        voice = self.voice if job.voice == "default" else job.voice
        return self.prompts.ids(voice, job.text)

    async def stream(self, job: TalkerJob) -> AsyncIterator[TalkerOutput]:
        frames = FrameAssembler()
        cutter = WindowCutter(group=job.group // FRAME, first=max(1, job.first_group // FRAME))
        deltas = self.engine.generate(job.request_id, self.prompt(job), self.sampling)
        async with aclosing(deltas):
            async for delta in deltas:
                windows = cutter.add(frames.feed(delta.token_ids))
                if not delta.finished:
                    for window in windows:
                        yield TalkerOutput(job.request_id, tokens=window.tokens())
                    continue
                windows += cutter.finish()
                for window in windows[:-1]:
                    yield TalkerOutput(job.request_id, tokens=window.tokens())
                last = windows[-1].tokens() if windows else []
                yield TalkerOutput(job.request_id, tokens=last, finished=True,
                                   finish_reason=delta.finish_reason)
