"""The qwen3_omni family's VoiceBox stage: the talker's codes to 24 kHz PCM by Qwen3-Omni's
code2wav, streamed per turn and batched across calls.

A job's tokens are its turn's next frames, flat: the 16 codes of frame 0 (codebook 0 to 15),
then frame 1's, and so on; a job whose tokens are not whole frames, or hold a code outside the
codebooks, fails alone (ValueError). Code2wav is causal (code2wav.py), so each job's frames are
voiced at once, from the first frame on, with no lookahead: each turn keeps a code2wav stream
(`StreamState`: the transformer's window of keys and values, the convolutions' left contexts)
and a job gets exactly the audio the reference's decode of the turn's frames so far adds, 1920
samples a frame (the turn's first job 555 fewer: the reference's right trims, which it never
voices). Jobs from concurrent calls wait a few milliseconds in the queue, then their turns'
streams render in one batched forward (`Code2WavRenderer.render_batch`); each job's samples are
written into the pool block leased for it.

A turn's jobs come in order; the request ids `call/turn/voicebox/<group>` name the turn
(everything before the last `/`), as the cascade forms them. The turn's closing job (no tokens,
`more=False`) ends its stream and is answered with no samples (nothing is held back for it to
voice); so does any job without `more`, after voicing its frames. An aborted turn's stream is
dropped; a turn cancelled between its jobs (no request here to abort) ages out beyond
`max_turns`. A job planned but never rendered (answered or abandoned while it waited in the
queue) still has its frames fed to the turn's stream, with its turn's next rendered job, so
that the turn's later audio keeps its context.

Settings: `release` (a release directory; default: the built family's), `device` and `dtype`
(where code2wav runs: `torch_placement`; the CPU in float32 by default), `batch_window_s`,
`max_batch` (the kit's batching) and `max_turns`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen3OmniMoeCode2Wav, Qwen3OmniMoeConfig

from pipeline.families.kit.batched_voicebox import BatchedVoiceBox
from pipeline.families.kit.release_build import release_dir
from pipeline.families.kit.release_tensors import release_tensors
from pipeline.families.kit.torch_placement import Placement
from pipeline.families.kit.torch_thread import TorchThread
from pipeline.families.kit.transformers_internals import model_from_config
from pipeline.families.kit.turn_states import keep_newest, turn_of
from pipeline.families.qwen3_omni.build import FAMILY
from pipeline.families.qwen3_omni.code2wav import Code2WavRenderer, StreamState
from pipeline.stage import StageContext, VoiceBoxJob

MAX_TURNS = 1024
SAMPLE_RATE = 24000  # code2wav's output rate in the Qwen3-Omni releases


def load_code2wav(release: Path, placement: Placement | None = None) -> Qwen3OmniMoeCode2Wav:
    """The release's code2wav where `placement` says (by default float32 on the CPU), built
    in its dtype as transformers builds it (the rotary frequencies stay float32)."""
    placement = placement or Placement(torch.device("cpu"), torch.float32)
    config = getattr(Qwen3OmniMoeConfig.from_pretrained(release), "code2wav_config", None)
    if config is None:
        raise ValueError(f"{release}: config.json has no code2wav_config")
    model: Qwen3OmniMoeCode2Wav = model_from_config(Qwen3OmniMoeCode2Wav, config,
                                                    dtype=placement.dtype)
    model.load_state_dict(release_tensors(release, "code2wav."))
    torch.nn.Module.to(model, placement.device)  # in place
    model.eval()
    return model


@dataclass(eq=False)
class TurnStream:
    """A turn's code2wav stream, and the frames planned for it that it has not rendered yet."""

    state: StreamState = field(default_factory=StreamState)
    planned: int = 0  # frames planned: rendered, or waiting in `unrendered`
    unrendered: list[torch.Tensor] = field(default_factory=list)  # (codebooks, frames) each

    def take(self, through: int) -> torch.Tensor:
        """The codes of the frames the stream has not rendered, up to frame `through`."""
        waiting = torch.cat(self.unrendered, dim=1)
        count = through - self.state.frames
        self.unrendered = [waiting[:, count:]] if count < waiting.shape[1] else []
        return waiting[:, :count]


@dataclass(frozen=True, eq=False)
class Plan:
    """What a job renders: its turn's frames through `through` (its own the last `frames`),
    of which it voices `samples` (its own frames' audio)."""

    turn: TurnStream
    frames: int
    through: int
    samples: int


def frames_of(tokens: list[int], codebooks: int, codebook_size: int) -> torch.Tensor:
    """A job's flat codes (frame by frame, codebook 0 first) as (codebooks, frames); a
    ValueError naming the fault for codes that are not whole frames of in-range codes."""
    if len(tokens) % codebooks:
        raise ValueError(f"qwen3_omni voicebox: {len(tokens)} codes are not whole frames of "
                         f"{codebooks} (one code a codebook, frame after frame)")
    flat = np.asarray(tokens, dtype=np.int64)
    bad = np.flatnonzero((flat < 0) | (flat >= codebook_size))
    if bad.size:
        index = int(bad[0])
        raise ValueError(f"qwen3_omni voicebox: code {int(flat[index])} (frame "
                         f"{index // codebooks}, codebook {index % codebooks}) is outside the "
                         f"codebook (0 to {codebook_size - 1})")
    return torch.from_numpy(flat).reshape(-1, codebooks).T.contiguous()


def rounds(jobs: list[tuple[VoiceBoxJob, Plan]]) -> list[list[int]]:
    """The batch's job indices in rounds that hold each turn at most once (a turn's second job
    in one batch renders after its first), in order."""
    taken: list[list[int]] = []
    seen: dict[int, int] = {}  # a turn's id -> its jobs so far
    for index, (_, plan) in enumerate(jobs):
        nth = seen.get(id(plan.turn), 0)
        seen[id(plan.turn)] = nth + 1
        if nth == len(taken):
            taken.append([])
        taken[nth].append(index)
    return taken


class Qwen3OmniVoiceBox(BatchedVoiceBox[Plan]):
    """VoiceBox on Qwen3-Omni's code2wav, streamed per turn and micro-batched across calls."""

    # the closing job must reach the stage to end its turn's stream (it voices nothing)
    holds_tokens = True

    async def start(self, ctx: StageContext) -> None:
        release = Path(ctx.settings.get("release") or release_dir(Path(ctx.models_dir) / FAMILY))
        self.torch = TorchThread(self.name)
        model = await self.torch.run(load_code2wav, release, Placement.of(ctx.settings))
        self.renderer = Code2WavRenderer(model)
        self.max_turns = int(ctx.settings.get("max_turns", MAX_TURNS))
        self.turns: OrderedDict[str, TurnStream] = OrderedDict()
        self._batch(ctx, SAMPLE_RATE)

    async def abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.turns.pop(turn_of(request_id), None)
        await super().abort(request_ids)

    def _plan(self, job: VoiceBoxJob) -> Plan:
        """The job's frames planned on its turn's stream (a new one for a new turn), kept as
        the newest turn while `more` of it follows; a job without `more` ends the turn."""
        codes = frames_of(list(job.tokens), self.renderer.num_quantizers,
                          self.renderer.codebook_size)
        key = turn_of(job.request_id)
        turn = self.turns.pop(key, None) or TurnStream()
        frames = codes.shape[1]
        if frames:
            turn.unrendered.append(codes)
        turn.planned += frames
        samples = (self.renderer.samples_after(turn.planned)
                   - self.renderer.samples_after(turn.planned - frames))
        if job.more:
            keep_newest(self.turns, key, turn, self.max_turns)
        return Plan(turn, frames, turn.planned, samples)

    def _samples_of(self, plan: Plan) -> int:
        return plan.samples

    def _render_batch(self, jobs: list[tuple[VoiceBoxJob, Plan]], outs: list[np.ndarray]
                      ) -> None:
        """Render the jobs' frames, their turns' streams together (a turn twice in the batch in
        a later forward), each job's own samples written into its block."""
        for indices in rounds(jobs):
            live = [index for index in indices if jobs[index][1].frames]
            plans = [jobs[index][1] for index in live]
            waves = self.renderer.render_batch(
                [plan.turn.state for plan in plans],
                [plan.turn.take(plan.through) for plan in plans])
            for index, plan, wave in zip(live, plans, waves, strict=True):
                # frames of jobs never rendered came first: this job's audio is the end
                torch.from_numpy(outs[index]).copy_(wave[wave.shape[0] - plan.samples:])
