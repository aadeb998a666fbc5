"""The qwen25_omni family's VoiceBox stage: codec tokens to 24 kHz PCM by Qwen2.5-Omni's token2wav.

Each job's tokens are rendered as a window (token2wav_window.py): the turn's earlier tokens as
left context, the job's tokens new. Jobs from concurrent calls wait a few milliseconds in the
queue, then each ODE evaluation of the DiT runs them all in one batched forward (BigVGAN runs
per window); each job's samples are copied into the pool block leased for it.

A turn's jobs share its tokens (`TurnTokens`): the request ids `call/turn/voicebox/<group>` name
the turn (everything before the last `/`), as the cascade forms them, and a turn's jobs come
one after another. Turns are dropped when aborted, and the oldest beyond `max_turns`.

Lookahead (setting `lookahead_tokens`, default 0): rendering a job's tokens with the turn's
next tokens after them makes its right edge match the full decode (see token2wav_window's
MEASURED: without it the window edges are the largest difference), but the audio of a job's
last `lookahead_tokens` tokens then waits for the next job, and a turn's last job must say it
is the last to get it. Until VoiceBoxJob carries that, every job is the last of its turn and
is rendered whole, its right edge off the full decode (measured on the tiny random model:
RMS 0.24 of the signal's, peaks 3x it, at the edges). The wiring it needs: a field
`more: bool = False` on VoiceBoxJob (more of the turn's tokens follow), turn.py's `_voice`
setting it on every group's job and sending one `VoiceBoxJob(rid, [], voice)` (no tokens,
`more=False`, a request id of the same turn) once the groups end, and the profile setting
`lookahead_tokens` (12 for the measured tiny config: one DiT block). First audio then comes
once `lookahead_tokens` more tokens than the first group have arrived (with groups of 4 then
16: the first group's job voices none, the second's 8 tokens). A job with `more=False` could
then also drop its turn's tokens at once; without it, turns age out of `max_turns`.

Settings: `release` (a release directory; default: the built family's), `batch_window_s`,
`max_batch`, `context_tokens`, `lookahead_tokens`, `max_turns`, and the reference's sampling
arguments `num_steps`, `guidance_scale`, `sway_coefficient` (`sampler_settings`).

The speakers come from the release's spk_dict.pt (`cond`, `ref_mel` per voice, as the
reference reads them); a voice the release lacks gets its first speaker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    Qwen2_5OmniConfig,
    Qwen2_5OmniToken2WavConfig,
    Qwen2_5OmniToken2WavModel,
)

from pipeline.families.queued_voicebox import QueuedJob, QueuedVoiceBox
from pipeline.families.qwen25_omni.build import FAMILY, release_dir
from pipeline.families.qwen25_omni.release import release_tensors
from pipeline.families.qwen25_omni.token2wav_window import (
    CONTEXT_TOKENS,
    SamplerSettings,
    Speaker,
    Window,
    WindowRenderer,
)
from pipeline.families.tiny.stage_support import TorchThread
from pipeline.shm import PoolExhaustedError
from pipeline.shm_lease import BlockLease
from pipeline.stage import StageContext, VoiceBoxJob

logger = logging.getLogger(__name__)

BATCH_WINDOW_S = 0.004
MAX_BATCH = 16
MAX_TURNS = 1024
SAMPLE_RATE = 24000  # BigVGAN's output rate in the Qwen2.5-Omni releases


def load_token2wav(release: Path) -> Qwen2_5OmniToken2WavModel:
    """The release's token2wav (DiT and BigVGAN) in float32, as the reference runs it."""
    config = Qwen2_5OmniConfig.from_pretrained(release).token2wav_config
    if not isinstance(config, Qwen2_5OmniToken2WavConfig):
        raise ValueError(f"{release}: config.json has no token2wav_config")
    model = Qwen2_5OmniToken2WavModel(config)
    model.load_state_dict(release_tensors(release, "token2wav."))
    model.float().eval()
    return model


def load_speakers(release: Path) -> dict[str, Speaker]:
    """The release's speakers (spk_dict.pt), by name."""
    table = torch.load(Path(release) / "spk_dict.pt", weights_only=True)
    return {name: Speaker(entry["cond"].float(), entry["ref_mel"].float())
            for name, entry in table.items()}


@dataclass
class TurnTokens:
    """One turn's tokens as far as its windows need them: the latest `tokens`, the first of
    which is the turn's token number `offset`, and how many of the turn's tokens are voiced."""

    tokens: list[int] = field(default_factory=list)
    offset: int = 0
    voiced: int = 0

    def window(self, renderer: WindowRenderer, new: list[int], more: bool, context: int,
               lookahead: int) -> Window:
        """Take the job's tokens; the window voicing all not yet voiced, but for the last
        `lookahead` when `more` of the turn follows. Keeps what later windows need."""
        self.tokens += new
        end = self.offset + len(self.tokens)
        upto = max(self.voiced, end - lookahead) if more else end
        at = self.voiced - self.offset
        window = renderer.plan(self.tokens[:at], self.offset,
                               self.tokens[at: upto - self.offset], context,
                               self.tokens[upto - self.offset:])
        self.voiced = upto
        drop = max(0, self.voiced - context - renderer.block_tokens - self.offset)
        del self.tokens[:drop]
        self.offset += drop
        return window


def sampler_settings(settings: dict[str, Any]) -> SamplerSettings:
    """The reference's sampling arguments from the stage's settings (`num_steps`,
    `guidance_scale`, `sway_coefficient`), its defaults for those not given: fewer ODE steps
    trade fidelity to the reference for speed (each step is four DiT forwards)."""
    defaults = SamplerSettings()
    return SamplerSettings(int(settings.get("num_steps", defaults.num_steps)),
                           float(settings.get("guidance_scale", defaults.guidance_scale)),
                           float(settings.get("sway_coefficient", defaults.sway_coefficient)))


def turn_of(request_id: str) -> str:
    """The turn a VoiceBox request belongs to: its id without the last `/` part."""
    return request_id.rpartition("/")[0]


class OmniVoiceBox(QueuedVoiceBox):
    """VoiceBox on Qwen2.5-Omni's token2wav, windowed and micro-batched."""

    task_label = "batcher"

    async def start(self, ctx: StageContext) -> None:
        release = Path(ctx.settings.get("release") or release_dir(Path(ctx.models_dir) / FAMILY))
        self.torch = TorchThread(self.name)
        model = await self.torch.run(load_token2wav, release)
        self.renderer = WindowRenderer(model, settings=sampler_settings(ctx.settings))
        self.speakers = load_speakers(release)
        self.window_s = float(ctx.settings.get("batch_window_s", BATCH_WINDOW_S))
        self.max_batch = int(ctx.settings.get("max_batch", MAX_BATCH))
        self.context = int(ctx.settings.get("context_tokens", CONTEXT_TOKENS))
        self.lookahead = int(ctx.settings.get("lookahead_tokens", 0))
        self.max_turns = int(ctx.settings.get("max_turns", MAX_TURNS))
        self.turns: OrderedDict[str, TurnTokens] = OrderedDict()
        self.forward_calls = 0
        self.jobs_rendered = 0
        self._serve(ctx, SAMPLE_RATE)

    async def abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.turns.pop(turn_of(request_id), None)
        await super().abort(request_ids)

    async def _render_jobs(self) -> None:
        while True:
            batch = [await self.jobs.get()]
            await asyncio.sleep(self.window_s)  # let concurrent requests' jobs join the batch
            batch += self.jobs.get_queued(self.max_batch - len(batch))
            windows = [self._window(entry.job) for entry in batch]  # in order: turns advance
            live = [(entry, window) for entry, window in zip(batch, windows, strict=True)
                    if entry.waiting]
            if live:
                await self._render_batch(live)

    async def _render_batch(self, live: list[tuple[QueuedJob, Window]]) -> None:
        """Lease each job's block, render the batch into them and answer each job."""
        with contextlib.ExitStack() as held:  # blocks not sent go back on the way out
            leased = await self._lease_each(live, held)
            if not leased:
                return
            try:
                await self.torch.run(self._render, [(entry.job, window, lease.array)
                                                    for entry, window, lease in leased])
            except Exception as exc:  # one bad batch fails its jobs, not the stage
                logger.exception("voicebox batch of %d jobs failed", len(leased))
                for entry, _, _ in leased:
                    entry.fail(exc)
                return
            for entry, _, lease in leased:
                entry.deliver(lease.send())

    def _window(self, job: VoiceBoxJob) -> Window:
        """The job's window, its turn's tokens advanced (the turn made the newest)."""
        key = turn_of(job.request_id)
        turn = self.turns.pop(key, None) or TurnTokens()
        self.turns[key] = turn
        while len(self.turns) > self.max_turns:
            self.turns.popitem(last=False)
        more = bool(getattr(job, "more", False))  # VoiceBoxJob has no `more` yet: see above
        return turn.window(self.renderer, list(job.tokens), more, self.context, self.lookahead)

    async def _lease_each(self, live: list[tuple[QueuedJob, Window]],
                          held: contextlib.ExitStack
                          ) -> list[tuple[QueuedJob, Window, BlockLease]]:
        """A block for each job's PCM; a job for which none comes free in time fails alone."""
        leased = []
        for entry, window in live:
            samples = window.new_tokens * self.renderer.samples_per_token
            try:
                lease = await self.ctx.acquire_tensor((samples,))
            except PoolExhaustedError as exc:
                entry.fail(exc)
                continue
            leased.append((entry, window, held.enter_context(lease)))
        return leased

    def _render(self, jobs: list[tuple[VoiceBoxJob, Window, np.ndarray]]) -> None:
        """Render the jobs' windows in one batch (in the torch thread), each job's samples
        copied into its block (a window with nothing to voice yet renders nothing)."""
        waves = self.renderer.render([window for _, window, _ in jobs],
                                     [self._speaker(job.voice) for job, _, _ in jobs])
        for (_, _, out), wave in zip(jobs, waves, strict=True):
            out[:] = wave.numpy()
        self.forward_calls += 1
        self.jobs_rendered += len(jobs)

    def _speaker(self, voice: str) -> Speaker:
        return self.speakers.get(voice) or next(iter(self.speakers.values()))

    def _close(self) -> None:
        self.torch.close()
