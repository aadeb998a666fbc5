"""The qwen25_omni family's VoiceBox stage: codec tokens to 24 kHz PCM by Qwen2.5-Omni's token2wav.

Each job's tokens are rendered as a window (token2wav_window.py): the turn's earlier tokens as
left context, the job's tokens new. Jobs from concurrent calls wait a few milliseconds in the
queue, then each ODE evaluation of the DiT runs them all in one batched forward (BigVGAN runs
per window); each job's samples are copied into the pool block leased for it.

A turn's jobs share its tokens (`TurnTokens`): the request ids `call/turn/voicebox/<group>` name
the turn (everything before the last `/`), as the cascade forms them, and a turn's jobs come
one after another. A turn's tokens are dropped by its closing job or when it is aborted; a turn
cancelled between its jobs (no request here to abort) ages out beyond `max_turns`.

Lookahead (setting `lookahead_tokens`; default one DiT attention block, `block_size / repeats`
tokens: 12 in the tiny config and in the published one): a job saying that `more` of its turn
follows (VoiceBoxJob.more: turn.py's `_voice` says so for every group) voices all but its
turn's last `lookahead_tokens` tokens, which it renders after them as lookahead only; their
audio waits for the next job, which renders them with its own tokens after them. Every
window's right edge then matches the full decode: the DiT's look-ahead layer sees one block
ahead per evaluation, and token2wav_window's MEASURED shows one block enough (half a block
leaves 3.5e-4, none errors as large as the signal at the window edges). The state carries
further across the ODE's evaluations as weights grow less plain: with random Linear biases in
the tiny release, one block leaves max 1.1e-4 of the RMS (two blocks 1.7e-6, at a group's more
first-audio delay); measure again with trained weights, as for the context.
The turn's closing job (no tokens, `more=False`, sent once the Talker is done with the turn)
voices the held-back tail and drops the turn's tokens. First audio waits for `lookahead_tokens`
tokens past the first voiced one: with groups of 4 then 16, the first group's job voices none,
the second's 8 tokens. `lookahead_tokens = 0` renders each job whole, its right edge off the
full decode (the seam tests/test_qwen25_omni_voicebox.py measures: a click every window).

Settings: `release` (a release directory; default: the built family's), `device` and `dtype`
(where token2wav runs: `torch_placement`; the CPU in float32 by default), `batch_window_s`,
`max_batch`, `context_tokens`, `lookahead_tokens`, `max_turns`, and the reference's sampling
arguments `num_steps`, `guidance_scale`, `sway_coefficient` (`sampler_settings`).

The speakers come from the release's spk_dict.pt (`cond`, `ref_mel` per voice, as the
reference reads them), chosen for a job's voice as the Talker chooses (`speaker_for`: "default"
is Chelsie where the release has her); a voice the release lacks fails the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
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
from pipeline.families.qwen25_omni.release import release_tensors, speaker_for
from pipeline.families.qwen25_omni.token2wav_window import (
    CONTEXT_TOKENS,
    SamplerSettings,
    Speaker,
    TurnTokens,
    Window,
    WindowRenderer,
)
from pipeline.families.tiny.stage_support import TorchThread
from pipeline.families.torch_placement import Placement
from pipeline.shm import PoolExhaustedError
from pipeline.shm_lease import BlockLease
from pipeline.stage import StageContext, VoiceBoxJob

logger = logging.getLogger(__name__)

BATCH_WINDOW_S = 0.004
MAX_BATCH = 16
MAX_TURNS = 1024
SAMPLE_RATE = 24000  # BigVGAN's output rate in the Qwen2.5-Omni releases


def load_token2wav(release: Path, placement: Placement | None = None
                   ) -> Qwen2_5OmniToken2WavModel:
    """The release's token2wav (DiT and BigVGAN) where `placement` says: by default float32
    on the CPU, as the reference runs it. The whole module is cast, BigVGAN's filter buffers
    included (transformers' own `dtype=` leaves them float32, which bfloat16 input refuses)."""
    placement = placement or Placement(torch.device("cpu"), torch.float32)
    config = Qwen2_5OmniConfig.from_pretrained(release).token2wav_config
    if not isinstance(config, Qwen2_5OmniToken2WavConfig):
        raise ValueError(f"{release}: config.json has no token2wav_config")
    model = Qwen2_5OmniToken2WavModel(config)
    model.load_state_dict(release_tensors(release, "token2wav."))
    torch.nn.Module.to(model, placement.device, placement.dtype)  # in place, buffers too
    model.eval()
    return model


def load_speakers(release: Path) -> dict[str, Speaker]:
    """The release's speakers (spk_dict.pt), by name."""
    table = torch.load(Path(release) / "spk_dict.pt", weights_only=True)
    return {name: Speaker(entry["cond"].float(), entry["ref_mel"].float())
            for name, entry in table.items()}


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
    holds_tokens = True  # the lookahead held back for a turn's next job

    async def start(self, ctx: StageContext) -> None:
        release = Path(ctx.settings.get("release") or release_dir(Path(ctx.models_dir) / FAMILY))
        self.torch = TorchThread(self.name)
        model = await self.torch.run(load_token2wav, release, Placement.of(ctx.settings))
        self.renderer = WindowRenderer(model, settings=sampler_settings(ctx.settings))
        self.speakers = load_speakers(release)
        self.window_s = float(ctx.settings.get("batch_window_s", BATCH_WINDOW_S))
        self.max_batch = int(ctx.settings.get("max_batch", MAX_BATCH))
        self.context = int(ctx.settings.get("context_tokens", CONTEXT_TOKENS))
        self.lookahead = int(ctx.settings.get("lookahead_tokens", self.renderer.block_tokens))
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
        """The job's window, its turn's tokens advanced and kept as the newest while `more`
        of the turn follows; the job that ends the turn drops them."""
        key = turn_of(job.request_id)
        turn = self.turns.pop(key, None) or TurnTokens()
        window = turn.window(self.renderer, list(job.tokens), job.more, self.context,
                             self.lookahead)
        if job.more:
            self.turns[key] = turn
            while len(self.turns) > self.max_turns:
                self.turns.popitem(last=False)
        return window

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
        """The release speaker for a job's voice, chosen as the Talker chooses it."""
        return self.speakers[speaker_for(voice, list(self.speakers))]

    def _close(self) -> None:
        self.torch.close()
