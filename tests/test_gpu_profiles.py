"""The real-weight profiles' GPU settings: laid over the profile on a GPU, valid, sized to fit
one 80 GB GPU with the real models' weights; refused without a GPU unless run on the CPU.

The sizes are counted from the published configurations on the meta device (no weights):
Qwen2.5-Omni-7B (`qwen25_omni.real_size`) and Orpheus 3B (`orpheus.real_size`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM

from agent.cli import check_device, main
from agent.config import Settings
from agent.profiles import gpu_answers, load_profiles, pipeline_settings
from pipeline.engines.vllm import EngineSettings
from pipeline.families.kit.dummy_weights import meta_tensors, parameter_count
from pipeline.families.kit.engine_stage import ENGINE_DEFAULTS
from pipeline.families.kit.torch_placement import Placement
from pipeline.families.orpheus.real_size import talker_config
from pipeline.families.qwen25_omni.real_size import real_config, release_tensors, stage_sizes
from pipeline.families.qwen25_omni.release import write_tiny_release

GPU_BYTES = 80 * 10**9  # one 80 GB GPU
CUDA_CONTEXT = 2**29  # about 0.5 GiB a process that touches the GPU
BF16 = 2
PROFILES = ("omni", "orpheus")
needs_no_gpu = pytest.mark.skipif(gpu_answers(), reason="this host has a GPU")


def _engines(profile: str) -> dict[str, dict[str, Any]]:
    stages = load_profiles()[profile]["gpu"]["stages"]
    return {stage: stages[stage]["engine"] for stage in ("thinker", "talker")}


@pytest.fixture(scope="module")
def omni_sizes() -> dict[str, Any]:
    return stage_sizes(release_tensors(real_config()), states_bytes=BF16)


def _weights(sizes: dict[str, Any], stage: str, part: str) -> int:
    return int(sizes[stage][part]["parameters"]) * BF16


@pytest.mark.parametrize("profile", PROFILES)
def test_gpu_settings_are_laid_over_on_a_gpu_only(profile: str, tmp_path: Path) -> None:
    on_gpu = pipeline_settings(Settings(profile=profile, model_path=tmp_path, device="cuda"))
    on_cpu = pipeline_settings(Settings(profile=profile, model_path=tmp_path, device="cpu"))
    for stage in ("thinker", "talker"):
        assert on_gpu.stages[stage]["engine"] == _engines(profile)[stage]
        assert "gpu_memory_utilization" not in on_cpu.stages.get(stage, {}).get("engine", {})
    assert on_gpu.stages["voicebox"]["device"] == "cuda"
    assert "device" not in on_cpu.stages.get("voicebox", {})
    assert on_gpu.cascade == on_cpu.cascade  # the overlay touches the stages only


@pytest.mark.parametrize("profile", PROFILES)
def test_every_gpu_engine_setting_is_a_valid_engine_argument(profile: str) -> None:
    for engine in _engines(profile).values():
        settings = EngineSettings.from_mapping({**ENGINE_DEFAULTS, **engine, "model": "m"})
        assert settings.dtype == "bfloat16" and not settings.enforce_eager  # CUDA graphs


def test_omni_fits_one_80_gb_gpu(omni_sizes: dict[str, Any]) -> None:
    engines = _engines("omni")
    held = {"thinker": _weights(omni_sizes, "thinker", "thinker LM (vLLM)"),
            "talker": _weights(omni_sizes, "talker", "talker LM (vLLM)")}
    for stage, engine in engines.items():  # each engine's share holds its weights and cache
        assert held[stage] + engine["kv_cache_memory_bytes"] < \
            engine["gpu_memory_utilization"] * GPU_BYTES
    torch_parts = (_weights(omni_sizes, "thinker", "thinker LM states (torch)")
                   + _weights(omni_sizes, "thinker", "audio tower (torch)")
                   + _weights(omni_sizes, "voicebox", "token2wav (torch)")
                   + 5 * CUDA_CONTEXT)  # two workers, two engine cores, the VoiceBox
    shares = sum(engine["gpu_memory_utilization"] for engine in engines.values())
    assert shares * GPU_BYTES + torch_parts < GPU_BYTES


def test_orpheus_fits_one_80_gb_gpu(omni_sizes: dict[str, Any]) -> None:
    engines = _engines("orpheus")
    talker = meta_tensors(lambda: LlamaForCausalLM(talker_config()))
    talker.pop("lm_head.weight")  # tied to the embedding
    held = {"thinker": _weights(omni_sizes, "thinker", "thinker LM (vLLM)"),
            "talker": parameter_count(talker) * BF16}
    for stage, engine in engines.items():
        assert held[stage] + engine["kv_cache_memory_bytes"] < \
            engine["gpu_memory_utilization"] * GPU_BYTES
    embed_table = real_config().thinker_config.text_config.vocab_size * 3584 * BF16
    torch_parts = (_weights(omni_sizes, "thinker", "audio tower (torch)") + embed_table
                   + 5 * CUDA_CONTEXT)
    shares = sum(engine["gpu_memory_utilization"] for engine in engines.values())
    assert shares * GPU_BYTES + torch_parts < GPU_BYTES


@needs_no_gpu
def test_a_gpu_profile_refuses_in_one_line_without_a_gpu(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    release = tmp_path / "release"
    write_tiny_release(release, 0)  # a valid release: only the device is missing
    capsys.readouterr()  # the build's progress
    code = main(["serve", "--models-dir", str(tmp_path / "models"), "--profile", "omni",
                 "--model-path", str(release)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "profile 'omni' is sized for a GPU and nvidia-smi finds none here" in err
    assert "--device cpu" in err
    check_device(Settings(profile="omni", model_path=release, device="cpu"))  # asked: runs
    check_device(Settings(profile="tiny"))  # a CPU profile needs nothing


def test_a_placement_names_what_it_cannot_do() -> None:
    assert Placement.of({}) == Placement(torch.device("cpu"), torch.float32)
    assert Placement.of({"audio_dtype": "bfloat16"}, "audio_").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="audio_dtype 'int8': one of float32, bfloat16"):
        Placement.of({"audio_dtype": "int8"}, "audio_")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda': torch sees no CUDA device"):
            Placement.of({"device": "cuda"})
