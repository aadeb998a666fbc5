"""The qwen25_omni VoiceBox: Qwen2.5-Omni's token2wav rendered in windows, micro-batched.

On the tiny release's token2wav (transformers' DiT and BigVGAN, RANDOM weights from the
build's fixed seed), CPU, one torch thread. Differences are relative to the full decode's RMS;
the tolerances come from token2wav_window's MEASURED (about 100x the measured differences,
which are float rounding).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.families.kit.release_build import release_dir
from pipeline.families.qwen25_omni.build import build_qwen25_omni
from pipeline.families.qwen25_omni.token2wav_window import (
    CONTEXT_TOKENS,
    LOOKAHEAD_TOKENS,
    Speaker,
    TurnTokens,
    Window,
    WindowRenderer,
)
from pipeline.families.qwen25_omni.voicebox import (
    OmniVoiceBox,
    load_speakers,
    load_token2wav,
)
from pipeline.stage import VoiceBoxJob
from pipeline.tensors.shm import BlockPool
from tests.stage_fixtures import pool_fixture, stage_fixture
from tests.stage_outputs import voiced_pcm

TURN = 52  # tokens: groups of 4, 16, 16, 16 as the cascade hands them on
GROUPS = [(0, 4), (4, 20), (20, 36), (36, 52)]
WINDOW_TOLERANCE = 1e-4  # max |windowed - full| / RMS(full); measured 2.7e-6 and 2.0e-6
NO_CONTEXT_WORSE = 0.01  # measured: 2.5 and 2.7 (no left context; no lookahead)
BATCH_TOLERANCE = 1e-5  # max |batched - alone| / RMS(alone); measured 2.0e-6


@pytest.fixture(scope="module")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The models directory with the qwen25_omni family built (tiny random release)."""
    models = tmp_path_factory.mktemp("models")
    build_qwen25_omni(models, progress=False)
    return models


@pytest.fixture(scope="module")
def renderer(family_models: Path) -> WindowRenderer:
    torch.set_num_threads(1)
    return WindowRenderer(load_token2wav(release_dir(family_models / "qwen25_omni")))


@pytest.fixture(scope="module")
def speaker(family_models: Path) -> Speaker:
    return next(iter(load_speakers(release_dir(family_models / "qwen25_omni")).values()))


@pytest.fixture(scope="module")
def codes() -> list[int]:
    return torch.randint(0, 256, (TURN,), generator=torch.Generator().manual_seed(7)).tolist()


@pytest.fixture(scope="module")
def full(renderer: WindowRenderer, speaker: Speaker, codes: list[int]) -> torch.Tensor:
    """One full decode of the turn, from the same noise table as the windows."""
    return renderer.render([Window(tuple(codes), 0, 0)], [speaker])[0]


def relative(piece: torch.Tensor, reference: torch.Tensor, full: torch.Tensor) -> float:
    return float((piece - reference).abs().max() / full.pow(2).mean().sqrt())


def test_full_decode_is_the_reference_forward(renderer: WindowRenderer, speaker: Speaker,
                                              codes: list[int]) -> None:
    """From the noise the reference draws, one window of all tokens is its forward() exactly."""
    code = torch.tensor([codes[:24]])
    torch.manual_seed(11)
    with torch.no_grad():
        reference = renderer.model(code, speaker.conditioning, speaker.reference_mel)
    torch.manual_seed(11)
    noise = torch.randn(1, 24 * renderer.repeats, renderer.dit.mel_dim)
    table, renderer.noise.table = renderer.noise.table, noise[0]
    try:
        ours = renderer.render([Window(tuple(codes[:24]), 0, 0)], [speaker])[0]
    finally:
        renderer.noise.table = table
    assert torch.equal(ours, reference)


def test_windows_match_the_full_decode(renderer: WindowRenderer, speaker: Speaker,
                                       codes: list[int], full: torch.Tensor) -> None:
    """A turn's groups, each rendered as it arrives with the chosen context and lookahead, then
    the held-back tail once the turn says it ends (the `more` wiring: each group's job says
    more follows, one job without tokens ends the turn), joined, are the full decode within
    the stated tolerance. Two blocks of lookahead: with the release's random non-zero biases one
    block leaves a peak of 1.1e-4 (two: 1.7e-6, float rounding; zero biases needed one, 2.9e-6);
    the stage's default of one block keeps its seams within the tolerance in RMS (below)."""
    turn, lookahead = TurnTokens(), 2 * LOOKAHEAD_TOKENS
    windows = [turn.window(renderer, codes[first:end], True, CONTEXT_TOKENS, lookahead)
               for first, end in GROUPS]
    windows.append(turn.window(renderer, [], False, CONTEXT_TOKENS, lookahead))
    assert [window.new_tokens for window in windows] == [0, 0, 12, 16, 24]
    joined = torch.cat(renderer.render(windows, [speaker] * len(windows)))
    assert joined.shape == full.shape
    error = relative(joined, full, full)
    print(f"\n[qwen25-omni-voicebox] windowed vs full decode, max diff / RMS: {error:.3g}")
    assert error < WINDOW_TOLERANCE


def test_a_window_without_context_or_lookahead_is_worse(
        renderer: WindowRenderer, speaker: Speaker, codes: list[int], full: torch.Tensor) -> None:
    """Tokens 24..40 (a block boundary at 24): without left context, or without lookahead,
    the window is far off the full decode; with both it matches."""
    step = renderer.samples_per_token
    target = full[24 * step: 40 * step]
    no_context = Window(tuple(codes[24:52]), 24, 0, 12)
    no_lookahead = renderer.plan(codes[:24], 0, codes[24:40], CONTEXT_TOKENS)
    both = renderer.plan(codes[:24], 0, codes[24:40], CONTEXT_TOKENS, codes[40:52])
    waves = renderer.render([no_context, no_lookahead, both], [speaker] * 3)
    errors = [relative(wave, target, full) for wave in waves]
    print(f"\n[qwen25-omni-voicebox] max diff / RMS: no context {errors[0]:.3g}, "
          f"no lookahead {errors[1]:.3g}, both {errors[2]:.3g}")
    assert errors[0] > NO_CONTEXT_WORSE and errors[1] > NO_CONTEXT_WORSE
    assert errors[2] < WINDOW_TOLERANCE


pool = pool_fixture("omnivox-omni-voicebox-test", block_count=16, block_size=1 << 20)
voicebox = stage_fixture(OmniVoiceBox, {"batch_window_s": 0.05}, "qwen25-omni-voicebox")
no_lookahead = stage_fixture(OmniVoiceBox, {"batch_window_s": 0.05, "lookahead_tokens": 0},
                             "qwen25-omni-voicebox-no-lookahead")


async def render_job(stage: OmniVoiceBox, pool: BlockPool, job: VoiceBoxJob) -> np.ndarray:
    """The job's PCM (one output, 24 kHz)."""
    return await voiced_pcm(stage, pool, job, 24000)


async def streamed_turn(stage: OmniVoiceBox, pool: BlockPool, turn: str, codes: list[int]
                        ) -> list[np.ndarray]:
    """Each job's PCM for the turn's groups as turn.py sends them: every group's job says
    more of the turn follows, then one closing job without tokens."""
    jobs = [VoiceBoxJob(f"{turn}/voicebox/0.{index}", codes[first:end], "Chelsie", more=True)
            for index, (first, end) in enumerate(GROUPS)]
    jobs.append(VoiceBoxJob(f"{turn}/voicebox/end", [], "Chelsie"))
    return [await render_job(stage, pool, job) for job in jobs]


def edge_error(pcms: list[np.ndarray], full: torch.Tensor, span: int) -> float:
    """The RMS of the joined jobs' difference from the full decode within `span` samples of
    each edge between two jobs' audio, relative to the full decode's RMS."""
    joined = torch.from_numpy(np.concatenate(pcms))
    assert joined.shape == full.shape
    edges = np.cumsum([len(pcm) for pcm in pcms])[:-1]
    near = torch.cat([(joined - full)[max(0, edge - span): edge + span]
                      for edge in edges if 0 < edge < len(full)])
    return float(near.pow(2).mean().sqrt() / full.pow(2).mean().sqrt())


async def test_a_streamed_turn_has_no_seam_at_the_window_edges(
        voicebox: OmniVoiceBox, no_lookahead: OmniVoiceBox, pool: BlockPool,
        renderer: WindowRenderer, codes: list[int], full: torch.Tensor) -> None:
    """With lookahead (the default: one DiT block), the audio around each window edge is the
    full decode's; the same groups rendered without lookahead leave a seam (a click) there."""
    assert voicebox.lookahead == renderer.block_tokens == 12
    span = 2 * renderer.samples_per_token  # two tokens either side of each edge
    with_lookahead = await streamed_turn(voicebox, pool, "seam/on", codes)
    assert [len(pcm) // renderer.samples_per_token for pcm in with_lookahead] == [0, 8, 16, 16, 12]
    without = await streamed_turn(no_lookahead, pool, "seam/off", codes)
    assert [len(pcm) // renderer.samples_per_token for pcm in without] == [4, 16, 16, 16, 0]
    errors = [edge_error(pcms, full, span) for pcms in (with_lookahead, without)]
    print(f"\n[qwen25-omni-voicebox] RMS diff / RMS at window edges: lookahead "
          f"{errors[0]:.3g}, none {errors[1]:.3g}")
    # Measured: 1.4e-5 with lookahead (3.0e-7 on a tiny release with zero Linear biases),
    # 0.36 without.
    assert errors[0] < WINDOW_TOLERANCE
    assert errors[1] > NO_CONTEXT_WORSE
    assert not voicebox.turns, "the closing job drops the turn's tokens"


async def test_stage_batches_concurrent_calls_and_keeps_each_turns_context(
        voicebox: OmniVoiceBox, pool: BlockPool, renderer: WindowRenderer, speaker: Speaker,
        codes: list[int]) -> None:
    """Two calls' jobs arriving together are one batch; a turn's later jobs are rendered after
    its earlier tokens, each holding back one block as lookahead while more follows; a job
    without `more` is rendered whole."""
    first = [VoiceBoxJob("a/1/voicebox/0.0", codes[:20], "Chelsie", more=True),
             VoiceBoxJob("b/1/voicebox/0.0", codes[10:30], "Chelsie")]
    calls_before = voicebox.forward_calls
    pcms = await asyncio.gather(*(render_job(voicebox, pool, job) for job in first))
    assert voicebox.forward_calls == calls_before + 1
    second = await render_job(voicebox, pool, VoiceBoxJob("a/1/voicebox/0.1", codes[20:36],
                                                          "Chelsie", more=True))
    closing = await render_job(voicebox, pool, VoiceBoxJob("a/1/voicebox/end", [], "Chelsie"))
    expected = renderer.render([renderer.plan([], 0, codes[:8], future=codes[8:20]),
                                Window(tuple(codes[10:30]), 0, 0),
                                renderer.plan(codes[:8], 0, codes[8:24], future=codes[24:36]),
                                renderer.plan(codes[:24], 0, codes[24:36])], [speaker] * 4)
    for pcm, wave in zip([*pcms, second, closing], expected, strict=True):
        assert pcm.shape == wave.shape
        assert relative(torch.from_numpy(pcm), wave, wave) < BATCH_TOLERANCE
    assert "a/1" not in voicebox.turns and "b/1" not in voicebox.turns
