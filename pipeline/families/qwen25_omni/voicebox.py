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

from pipeline.families.kit.batched_voicebox import BatchedVoiceBox
from pipeline.families.kit.release_build import release_dir
from pipeline.families.kit.release_tensors import release_tensors
from pipeline.families.kit.torch_placement import Placement
from pipeline.families.kit.torch_thread import TorchThread
from pipeline.families.kit.turn_states import keep_newest, turn_of
from pipeline.families.qwen25_omni.build import FAMILY
from pipeline.families.qwen25_omni.release import speaker_for
from pipeline.families.qwen25_omni.token2wav_window import (
    CONTEXT_TOKENS,
    SamplerSettings,
    Speaker,
    TurnTokens,
    Window,
    WindowRenderer,
)
from pipeline.stage import StageContext, VoiceBoxJob

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


class OmniVoiceBox(BatchedVoiceBox[Window]):
    """VoiceBox on Qwen2.5-Omni's token2wav, windowed and micro-batched."""

    holds_tokens = True  # the lookahead held back for a turn's next job

    async def start(self, ctx: StageContext) -> None:
        release = Path(ctx.settings.get("release") or release_dir(Path(ctx.models_dir) / FAMILY))
        self.torch = TorchThread(self.name)
        model = await self.torch.run(load_token2wav, release, Placement.of(ctx.settings))
        self.renderer = WindowRenderer(model, settings=sampler_settings(ctx.settings))
        self.speakers = load_speakers(release)
        self.context = int(ctx.settings.get("context_tokens", CONTEXT_TOKENS))
        self.lookahead = int(ctx.settings.get("lookahead_tokens", self.renderer.block_tokens))
        self.max_turns = int(ctx.settings.get("max_turns", MAX_TURNS))
        self.turns: OrderedDict[str, TurnTokens] = OrderedDict()
        self._batch(ctx, SAMPLE_RATE)

    async def abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.turns.pop(turn_of(request_id), None)
        await super().abort(request_ids)

    def _plan(self, job: VoiceBoxJob) -> Window:
        """The job's window, its turn's tokens advanced and kept as the newest while `more`
        of the turn follows; the job that ends the turn drops them."""
        key = turn_of(job.request_id)
        turn = self.turns.pop(key, None) or TurnTokens()
        window = turn.window(self.renderer, list(job.tokens), job.more, self.context,
                             self.lookahead)
        if job.more:
            keep_newest(self.turns, key, turn, self.max_turns)
        return window

    def _samples_of(self, plan: Window) -> int:
        return plan.new_tokens * self.renderer.samples_per_token

    def _render_batch(self, jobs: list[tuple[VoiceBoxJob, Window]], outs: list[np.ndarray]
                      ) -> None:
        """Render the jobs' windows in one batch, each job's samples copied into its block
        (a window with nothing to voice yet renders nothing)."""
        waves = self.renderer.render([window for _, window in jobs],
                                     [self._speaker(job.voice) for job, _ in jobs])
        for out, wave in zip(outs, waves, strict=True):
            out[:] = wave.numpy()

    def _speaker(self, voice: str) -> Speaker:
        """The release speaker for a job's voice, chosen as the Talker chooses it."""
        return self.speakers[speaker_for(voice, list(self.speakers))]
