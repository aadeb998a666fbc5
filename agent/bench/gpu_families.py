"""What `omnivox bench gpu` serves: each real-architecture family built at its real size with no
weights (or tiny, on a CPU), and the pipeline settings that run it.

Settings start from the family's tiny profile (`omni-tiny`, `orpheus-tiny`) and change what the
size and the device need: every vLLM engine starts with `load_format="dummy"`; on a GPU the
engines run bfloat16 with a fixed KV cache each (`KV_CACHE`, so both families fit one H200 one
after the other), the core bindings go, and the Thinker's hidden-state model and SNAC move to
the GPU. Qwen2.5-Omni's audio tower and token2wav have no device setting yet: they run on the
CPU (the figures say so).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.profiles import load_profiles

FAMILIES = ("qwen25_omni", "orpheus")
PROFILES = {"qwen25_omni": "omni-tiny", "orpheus": "orpheus-tiny"}
GIB = 2**30
KV_CACHE = {("qwen25_omni", "thinker"): 8 * GIB, ("qwen25_omni", "talker"): 4 * GIB,
            ("orpheus", "thinker"): 8 * GIB, ("orpheus", "talker"): 12 * GIB}
# vLLM refuses to start unless the device's free memory covers this fraction of it, even with
# a fixed KV cache: each engine asks for what it holds, so the two engines of a family (and
# the Thinker's torch model) start side by side.
GPU_FRACTION = {("qwen25_omni", "thinker"): 0.25, ("qwen25_omni", "talker"): 0.10,
                ("orpheus", "thinker"): 0.25, ("orpheus", "talker"): 0.20}
# Eager (no CUDA graphs): graph capture would spend the time budget starting engines.
GPU_ENGINE = {"dtype": "bfloat16", "max_num_seqs": 128, "max_model_len": 2048,
              "enforce_eager": True}
CPU_PARTS = {"qwen25_omni": ["thinker audio tower", "voicebox token2wav"],
             "orpheus": ["thinker audio tower"]}


@dataclass(frozen=True)
class FamilyRun:
    """One family's check: its pipeline settings, stage sizes, and whether turns carry audio."""

    family: str
    settings: dict[str, Any]  # PipelineSettings fields
    sizes: dict[str, Any]  # stage -> part -> {"parameters", "weight_bytes"}
    audio: bool


def prepare(family: str, size: str, root: Path, cuda: bool) -> FamilyRun:
    """Build `family` at `size` ("real": weightless; "tiny") under `root`; its run."""
    if family == "qwen25_omni":
        return _qwen25_omni(size, root, cuda)
    if family == "orpheus":
        return _orpheus(size, root, cuda)
    raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")


def _qwen25_omni(size: str, root: Path, cuda: bool) -> FamilyRun:
    sizes = _omni_built(size, root)
    settings = _settings("qwen25_omni", root, cuda)
    stages = settings["stages"]
    stages["talker"]["max_codes"] = 50 if size == "real" else 40  # random codes never stop
    if cuda:
        stages["thinker"] |= {"states_device": "cuda", "states_dtype": "bfloat16"}
    return FamilyRun("qwen25_omni", settings, sizes, audio=True)


def _omni_built(size: str, root: Path) -> dict[str, Any]:
    """Build qwen25_omni at `size` under `root` (kept when built); its stage sizes."""
    from transformers import Qwen2_5OmniConfig

    from pipeline.families.qwen25_omni.build import build_qwen25_omni, release_dir
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
    if cuda:
        stages["thinker"]["states_dtype"] = "bfloat16"  # its embedding table
        stages["voicebox"]["device"] = "cuda"
    return FamilyRun("orpheus", settings, {"thinker": thinker, **stage_sizes(checkpoint)},
                     audio=True)


def _settings(family: str, root: Path, cuda: bool) -> dict[str, Any]:
    """The family's tiny profile, models under `root` (already built), dummy engines."""
    fields = copy.deepcopy(load_profiles()[PROFILES[family]])
    fields.pop("description", None)
    fields |= {"models_dir": str(root), "build_models": False}
    stages = fields.setdefault("stages", {})
    for stage in ("thinker", "talker", "voicebox"):
        stages.setdefault(stage, {})
    for stage in ("thinker", "talker"):
        engine = stages[stage].setdefault("engine", {})
        if cuda:
            engine.pop("cpu_cores", None)
            engine["kv_cache_memory_bytes"] = KV_CACHE[(family, stage)]
            engine["gpu_memory_utilization"] = GPU_FRACTION[(family, stage)]
            engine |= GPU_ENGINE
        engine["load_format"] = "dummy"
    return fields
