"""What `omnivox bench gpu` serves: each real-architecture family built at its real size with no
weights (or tiny, on a CPU), and the pipeline settings that run it.

Settings start from the family's tiny profile (`omni-tiny`, `orpheus-tiny`, `qwen3-omni-tiny`:
fixed reply lengths for random weights) and change what the size and the device need: every
vLLM engine starts with `load_format="dummy"`; on a GPU the core bindings go and the real
profile's `gpu` table (`omni`, `orpheus`, `qwen3-omni` in agent/profiles.toml: bfloat16, each
engine's KV cache and memory share, CUDA graphs, every torch part on the GPU) is laid over them,
so the check runs the settings a user's GPU host gets. qwen3_omni takes `qwen3-omni`'s (one
H200, bf16) where the GPU has the memory for it (`LARGE_GPU_BYTES`), else `qwen3-omni-80gb`'s
(one 80 GB GPU, both LMs in vLLM's online FP8).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent.profiles import load_profiles, overlaid

FAMILIES = ("qwen25_omni", "orpheus", "qwen3_omni")
PROFILES = {"qwen25_omni": "omni-tiny", "orpheus": "orpheus-tiny",
            "qwen3_omni": "qwen3-omni-tiny"}
# whose `gpu` table runs: the first where the GPU holds LARGE_GPU_BYTES, else the second
GPU_PROFILES = {"qwen25_omni": ("omni", "omni"), "orpheus": ("orpheus", "orpheus"),
                "qwen3_omni": ("qwen3-omni", "qwen3-omni-80gb")}
LARGE_GPU_BYTES = 120 * 2**30  # an H200 (140 GiB) holds qwen3-omni's; an 80 GB GPU does not


@dataclass(frozen=True)
class FamilyRun:
    """One family's check: its pipeline settings, stage sizes, and whether turns carry audio."""

    family: str
    settings: dict[str, Any]  # PipelineSettings fields
    sizes: dict[str, Any]  # stage -> part -> {"parameters", "weight_bytes"}
    audio: bool
    gpu_profile: str | None = None  # whose `gpu` table the settings hold (None: a CPU run)


def prepare(family: str, size: str, root: Path, cuda: bool) -> FamilyRun:
    """Build `family` at `size` ("real": weightless; "tiny") under `root`; its run."""
    builders = {"qwen25_omni": _qwen25_omni, "orpheus": _orpheus, "qwen3_omni": _qwen3_omni}
    if family not in builders:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")
    run = builders[family](size, root, cuda)
    return replace(run, gpu_profile=chosen_gpu_profile(family, cuda))


def _qwen25_omni(size: str, root: Path, cuda: bool) -> FamilyRun:
    sizes = _omni_built(size, root)
    settings = _settings("qwen25_omni", root, cuda)
    stages = settings["stages"]
    stages["talker"]["max_codes"] = 160 if size == "real" else 40  # random codes never stop
    return FamilyRun("qwen25_omni", settings, sizes, audio=True)


def _omni_built(size: str, root: Path) -> dict[str, Any]:
    """Build qwen25_omni at `size` under `root` (kept when built); its stage sizes."""
    from transformers import Qwen2_5OmniConfig

    from pipeline.families.kit.release_build import release_dir
    from pipeline.families.qwen25_omni.build import build_qwen25_omni
    from pipeline.families.qwen25_omni.real_size import (
        release_tensors,
        stage_sizes,
        write_dummy_release,
    )

    if size == "real":
        release = root / "qwen25_omni-release"
        if not (release / "config.json").is_file():
            write_dummy_release(release)
        family_dir = build_qwen25_omni(root, progress=False, release=release,
                                       dummy_weights=True)
    else:
        family_dir = build_qwen25_omni(root, progress=False)
    config = Qwen2_5OmniConfig.from_pretrained(release_dir(family_dir))
    states_bytes = 2 if size == "real" else 4  # the GPU run holds them in bfloat16
    return stage_sizes(release_tensors(config), states_bytes)


def _orpheus(size: str, root: Path, cuda: bool) -> FamilyRun:
    from pipeline.families.orpheus.build import build_orpheus
    from pipeline.families.orpheus.real_size import SNAC_DIR, TALKER, stage_sizes
    from pipeline.families.orpheus.real_size import write_dummy_checkpoint as write_checkpoint

    # The family's Thinker is qwen25_omni's at the same size (its LM and audio tower; no
    # hidden-state model: the Orpheus Talker reads text).
    thinker = _omni_built(size, root)["thinker"]
    thinker = {part: row for part, row in thinker.items() if "states" not in part}
    if size == "real":
        checkpoint = root / "orpheus-checkpoint"
        if not (checkpoint / SNAC_DIR / "config.json").is_file():
            write_checkpoint(checkpoint)
    else:
        checkpoint = build_orpheus(root, progress=False)
    settings = _settings("orpheus", root, cuda)
    stages = settings["stages"]
    stages["talker"]["model_dir"] = str(checkpoint / TALKER)
    stages["voicebox"]["model_dir"] = str(checkpoint / SNAC_DIR)
    if size == "real":  # every chunk voiced to its end: about 22 frames (154 codes) each
        stages["talker"]["max_tokens"] = 1100
        settings.setdefault("cascade", {})["closing_chunk"] = True  # its tail voiced too
    return FamilyRun("orpheus", settings, {"thinker": thinker, **stage_sizes(checkpoint)},
                     audio=True)


def _qwen3_omni(size: str, root: Path, cuda: bool) -> FamilyRun:
    """qwen3_omni at `size` under `root` (kept when built): a weightless Qwen3-Omni-30B-A3B
    release at real size, the tiny one otherwise. Its tiny profile bounds a reply's speech
    (`max_frames` 40: 3.2 s, as qwen25_omni's 160 codes), the same at both sizes."""
    from transformers import Qwen3OmniMoeConfig

    from pipeline.families.kit.release_build import release_dir
    from pipeline.families.qwen3_omni.build import build_qwen3_omni
    from pipeline.families.qwen3_omni.real_size import release_tensors
    from pipeline.families.qwen3_omni.real_stages import stage_sizes, write_dummy_release

    if size == "real":
        release = root / "qwen3_omni-release"
        if not (release / "config.json").is_file():
            write_dummy_release(release)
        family_dir = build_qwen3_omni(root, progress=False, release=release,
                                      dummy_weights=True)
    else:
        family_dir = build_qwen3_omni(root, progress=False)
    config = Qwen3OmniMoeConfig.from_pretrained(release_dir(family_dir))
    states_bytes = 2 if size == "real" else 4  # the GPU run holds them in bfloat16
    sizes = stage_sizes(config, release_tensors(config), states_bytes)
    return FamilyRun("qwen3_omni", _settings("qwen3_omni", root, cuda), sizes, audio=True)


def gpu_profile(family: str, device_bytes: int) -> str:
    """The profile whose `gpu` table `family` runs with on a GPU of `device_bytes`."""
    large, other = GPU_PROFILES[family]
    return large if device_bytes >= LARGE_GPU_BYTES else other


def chosen_gpu_profile(family: str, cuda: bool) -> str | None:
    """The profile whose `gpu` table `family` runs with here (None: no GPU, no table)."""
    if not cuda:
        return None
    import torch

    return gpu_profile(family, int(torch.cuda.get_device_properties(0).total_memory))


def _settings(family: str, root: Path, cuda: bool) -> dict[str, Any]:
    """The family's tiny profile, models under `root` (already built), dummy engines; on a
    GPU, the real profile's GPU settings over it."""
    profiles = load_profiles()
    fields = copy.deepcopy(profiles[PROFILES[family]])
    fields.pop("description", None)
    fields |= {"models_dir": str(root), "build_models": False}
    stages = fields.setdefault("stages", {})
    for stage in ("thinker", "talker", "voicebox"):
        stages.setdefault(stage, {})
    for stage in ("thinker", "talker"):
        engine = stages[stage].setdefault("engine", {})
        if cuda:
            engine.pop("cpu_cores", None)
        engine["load_format"] = "dummy"
    profile = chosen_gpu_profile(family, cuda)
    if profile is not None:
        fields = overlaid(fields, profiles[profile]["gpu"])
    return fields
