"""The qwen25_omni torch parts run where their stage's settings place them (`Placement`): here
in bfloat16 on the CPU, as the `omni` profile runs them in bfloat16 on a GPU. Against the same
parts in float32: the same shapes, finite, and close (bfloat16 keeps 8 bits of mantissa).
The tiny release's weights are RANDOM."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.families.kit.torch_placement import Placement
from pipeline.families.qwen25_omni.audio_tower import AudioTower
from pipeline.families.qwen25_omni.release import write_tiny_release
from pipeline.families.qwen25_omni.token2wav_window import Window, WindowRenderer
from pipeline.families.qwen25_omni.voicebox import load_speakers, load_token2wav

CPU_F32 = Placement(torch.device("cpu"), torch.float32)
CPU_BF16 = Placement(torch.device("cpu"), torch.bfloat16)
# |bf16 - f32| RMS over the f32 output's RMS: measured 0.9% (audio tower rows) and 6% (a
# token2wav window: 5 ODE steps of a random DiT, then BigVGAN)
AUDIO_ROWS_TOLERANCE, WAVE_TOLERANCE = 0.05, 0.25


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("omni-release")
    write_tiny_release(directory, 3)
    return directory


def _relative_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    error = (got.float() - want.float()).pow(2).mean().sqrt()
    return float(error / want.float().pow(2).mean().sqrt())


def test_the_audio_tower_runs_in_its_placement(release: Path) -> None:
    audio = (np.sin(np.arange(32000) * 0.05) * 8000).astype(np.int16)
    f32 = AudioTower.load(release, CPU_F32).encode(audio)
    bf16_tower = AudioTower.load(release, CPU_BF16)
    assert next(bf16_tower.encoder.parameters()).dtype == torch.bfloat16
    bf16 = bf16_tower.encode(audio)
    assert bf16.dtype == torch.bfloat16 and bf16.shape == f32.shape
    assert _relative_rms(bf16, f32) < AUDIO_ROWS_TOLERANCE


def test_token2wav_renders_in_its_placement(release: Path) -> None:
    speaker = next(iter(load_speakers(release).values()))
    window = Window(tuple(range(10, 34)), start=0, keep_from=0)
    waves = {}
    for name, placement in (("f32", CPU_F32), ("bf16", CPU_BF16)):
        model = load_token2wav(release, placement)
        assert {p.dtype for p in model.parameters()} == {placement.dtype}
        assert {b.dtype for b in model.buffers() if b.is_floating_point()} <= {placement.dtype}
        [waves[name]] = WindowRenderer(model).render([window], [speaker])
    assert waves["bf16"].dtype == torch.float32 and waves["bf16"].shape == waves["f32"].shape
    assert torch.isfinite(waves["bf16"]).all()
    assert _relative_rms(waves["bf16"], waves["f32"]) < WAVE_TOLERANCE
