"""What `omnivox bench gpu` serves: each real-architecture family built at its real size with no
weights (or tiny, on a CPU), and the pipeline settings that run it.

Settings start from the family's tiny profile (`omni-tiny`, `orpheus-tiny`: fixed reply lengths
for random weights) and change what the size and the device need: every vLLM engine starts with
`load_format="dummy"`; on a GPU the core bindings go and the real profile's `gpu` table
(`omni`, `orpheus` in agent/profiles.toml: bfloat16, each engine's KV cache and memory share,
CUDA graphs, every torch part on the GPU) is laid over them, so the check runs the settings a
user's GPU host gets.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.profiles import load_profiles, overlaid

FAMILIES = ("qwen25_omni", "orpheus")
PROFILES = {"qwen25_omni": "omni-tiny", "orpheus": "orpheus-tiny"}
GPU_PROFILES = {"qwen25_omni": "omni", "orpheus": "orpheus"}  # whose `gpu` table runs


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
    if cuda:
        fields = overlaid(fields, profiles[GPU_PROFILES[family]]["gpu"])
    return fields
