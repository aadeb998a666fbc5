"""The real-weight profiles' GPU settings: laid over the profile on a GPU, valid, sized to fit
one 80 GB GPU (`qwen3-omni`: one H200) with the real models' weights; refused without a GPU
unless run on the CPU.

The sizes are counted from the published configurations on the meta device (no weights):
Qwen2.5-Omni-7B (`qwen25_omni.real_size`), Orpheus 3B (`orpheus.real_size`) and
Qwen3-Omni-30B-A3B (`qwen3_omni.real_size`, its LMs in FP8 as `qwen3_omni.real_stages` counts
them where a profile quantizes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM

from agent.cli import check_device, main
from agent.config import Settings
from agent.profiles import gpu_answers, load_profiles, pipeline_settings
from pipeline.engines.vllm import LAST_STATE_POOLING, EngineSettings, engine_args
from pipeline.families.kit.dummy_weights import meta_tensors, parameter_count
from pipeline.families.kit.engine_stage import ENGINE_DEFAULTS
from pipeline.families.kit.hf_release import WEIGHTS_INDEX, copy_tokenizer_files
from pipeline.families.kit.torch_placement import Placement
from pipeline.families.orpheus.real_size import talker_config
from pipeline.families.qwen3_omni import real_size as qwen3_size
from pipeline.families.qwen3_omni import real_stages as qwen3_stages
from pipeline.families.qwen3_omni import talker_lm as qwen3_talker_lm
from pipeline.families.qwen3_omni import thinker_lm as qwen3_thinker_lm
from pipeline.families.qwen3_omni.tiny_tokenizer import write_tiny_tokenizer
from pipeline.families.qwen25_omni.real_size import real_config, release_tensors, stage_sizes
from pipeline.families.qwen25_omni.release import write_tiny_release

GPU_BYTES = 80 * 10**9  # one 80 GB GPU
H200_BYTES = 141 * 10**9  # one H200
CUDA_CONTEXT = 2**29  # about 0.5 GiB a process that touches the GPU
BF16 = 2
PROFILES = ("omni", "orpheus", "qwen3-omni", "qwen3-omni-80gb")
# qwen3-omni's profiles: the GPU each is sized for, and what vLLM quantizes there
QWEN3_OMNI = {"qwen3-omni": (H200_BYTES, None), "qwen3-omni-80gb": (GPU_BYTES, "fp8_per_tensor")}
# what each qwen3-omni engine's share keeps beyond weights and KV cache, at least: activations
# and CUDA graphs (the omni profile's engines keep 2.4 GiB and more)
ENGINE_HEADROOM = 2**30
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


@pytest.fixture(scope="module")
def qwen3_tensors() -> dict[str, torch.Tensor]:
    return qwen3_size.release_tensors(qwen3_size.real_config())


@pytest.mark.parametrize("profile", QWEN3_OMNI)
def test_qwen3_omni_places_every_torch_part_on_the_gpu(profile: str, tmp_path: Path) -> None:
    on_gpu = pipeline_settings(Settings(profile=profile, model_path=tmp_path, device="cuda"))
    on_cpu = pipeline_settings(Settings(profile=profile, model_path=tmp_path, device="cpu"))
    placed = {"thinker": ("states_", "audio_"), "talker": ("",), "voicebox": ("",)}
    for stage, prefixes in placed.items():
        for prefix in prefixes:
            gpu = on_gpu.stages[stage]
            assert gpu[f"{prefix}device"] == "cuda", (stage, prefix)
            # a dtype the placement takes (its device is checked where CUDA is)
            assert Placement.of({f"{prefix}dtype": gpu[f"{prefix}dtype"]}, prefix).dtype == \
                torch.bfloat16, (stage, prefix)
            assert f"{prefix}device" not in on_cpu.stages.get(stage, {})


@pytest.mark.parametrize("profile", QWEN3_OMNI)
def test_qwen3_omni_engines_are_the_stages_own_and_quantized_where_sized(profile: str) -> None:
    """Each engine's settings as its stage builds them (the Talker's a pooling engine without a
    tokenizer) are valid; only the 80 GB profile quantizes, both LMs alike; the block size is
    vLLM's GPU default (16 rows: each Talker frame recomputes at most 15 rows of history)."""
    engines = _engines(profile)
    thinker = EngineSettings.from_mapping({**ENGINE_DEFAULTS, **engines["thinker"],
                                           "model": "m"})
    talker = EngineSettings.from_mapping({**ENGINE_DEFAULTS, "skip_tokenizer_init": True,
                                          **LAST_STATE_POOLING, **engines["talker"],
                                          "model": "m"})
    quantization = QWEN3_OMNI[profile][1]
    for settings in (thinker, talker):
        assert settings.quantization == quantization and settings.block_size is None


@pytest.mark.parametrize("profile", QWEN3_OMNI)
def test_qwen3_omni_fits_its_gpu(profile: str, qwen3_tensors: dict[str, torch.Tensor]) -> None:
    """Each engine's share holds its LM (bf16, or FP8 where the profile quantizes), its KV cache
    and ENGINE_HEADROOM; the cache holds one whole request of max_model_len (vLLM refuses an
    engine whose cache cannot), within the release's positions; the shares, the torch parts
    (bf16) and the CUDA contexts fit the GPU."""
    device_bytes, quantization = QWEN3_OMNI[profile]
    config: Any = qwen3_size.real_config()
    texts = {"thinker": config.thinker_config.text_config,
             "talker": config.talker_config.text_config}
    lms = {"thinker": qwen3_stages.THINKER_LM, "talker": qwen3_stages.TALKER_LM}
    engines = _engines(profile)
    for stage, engine in engines.items():
        assert engine.get("quantization") == quantization
        held = qwen3_stages.lm_weight_bytes(qwen3_tensors, lms[stage], quantization)
        assert held + engine["kv_cache_memory_bytes"] + ENGINE_HEADROOM < \
            engine["gpu_memory_utilization"] * device_bytes, stage
        whole_request = engine["max_model_len"] * qwen3_stages.kv_bytes_per_token(texts[stage])
        assert whole_request <= engine["kv_cache_memory_bytes"], stage
        assert engine["max_model_len"] <= texts[stage].max_position_embeddings
    sizes = qwen3_stages.stage_sizes(config, qwen3_tensors)
    torch_parts = sum(part["weight_bytes"] for parts in sizes.values()
                      for name, part in parts.items() if "(torch)" in name)
    torch_parts += 5 * CUDA_CONTEXT  # three workers, two engine cores
    shares = sum(engine["gpu_memory_utilization"] for engine in engines.values())
    assert shares * device_bytes + torch_parts < device_bytes


@pytest.fixture(scope="module")
def qwen3_lm_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The real-size thinker and talker LM directories' config.json (and tokenizer), as the
    build derives them from a release: here its config.json, tokenizer and weight index only
    (the tensors' names; no weights at all)."""
    root = tmp_path_factory.mktemp("qwen3")
    release = root / "release"
    config = qwen3_stages.dummy_config()
    config.save_pretrained(release)
    names = qwen3_stages.published_tensors(qwen3_size.release_tensors(config))
    (release / WEIGHTS_INDEX).write_text(json.dumps({"weight_map": dict.fromkeys(names, "-")}))
    write_tiny_tokenizer(release)
    dirs = {"thinker": root / "thinker_lm", "talker": root / "talker_lm"}
    qwen3_thinker_lm.lm_config(release).save_pretrained(dirs["thinker"])
    copy_tokenizer_files(release, dirs["thinker"])
    qwen3_talker_lm.lm_config(release).save_pretrained(dirs["talker"])
    return dirs


@pytest.mark.parametrize("profile", QWEN3_OMNI)
def test_qwen3_omni_engines_configure_in_vllm(profile: str, qwen3_lm_dirs: dict[str, Path]
                                              ) -> None:
    """vLLM configures each engine of the profile over the real-size LM's config, as the stage
    builds its settings (no weights read, nothing started): the quantization it resolves, the
    window, the Talker a pooling engine."""
    engines = _engines(profile)
    stage_defaults = {"thinker": {}, "talker": {"skip_tokenizer_init": True,
                                                **LAST_STATE_POOLING}}
    for stage, engine in engines.items():
        settings = EngineSettings.from_mapping({
            **ENGINE_DEFAULTS, **stage_defaults[stage], **engine,
            "model": str(qwen3_lm_dirs[stage]), "load_format": "dummy"})
        config = engine_args(settings).create_engine_config()
        assert config.model_config.quantization == QWEN3_OMNI[profile][1], stage
        assert config.model_config.max_model_len == engine["max_model_len"], stage
        assert (config.model_config.runner_type == "pooling") == (stage == "talker"), stage


def test_qwen3_omni_needs_its_lms_quantized_on_an_80_gb_gpu(
        qwen3_tensors: dict[str, torch.Tensor]) -> None:
    """In bf16 the two LMs and the torch parts exceed 80 GB before any KV cache; in FP8 the LMs
    hold about half as much (the embeddings, heads and norms stay bf16)."""
    config = qwen3_size.real_config()
    sizes = qwen3_stages.stage_sizes(config, qwen3_tensors)
    lms = (qwen3_stages.THINKER_LM, qwen3_stages.TALKER_LM)
    bf16 = sum(qwen3_stages.lm_weight_bytes(qwen3_tensors, lm) for lm in lms)
    fp8 = sum(qwen3_stages.lm_weight_bytes(qwen3_tensors, lm, "fp8_per_tensor") for lm in lms)
    torch_parts = sum(part["weight_bytes"] for parts in sizes.values()
                      for name, part in parts.items() if "(torch)" in name)
    assert bf16 == sum(part["weight_bytes"] for parts in sizes.values()
                       for name, part in parts.items() if "(vLLM)" in name)
    assert bf16 + torch_parts > GPU_BYTES
    assert 0.5 < fp8 / bf16 < 0.52


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
