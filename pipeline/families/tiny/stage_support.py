"""What the tiny family's stages share: where the models are and their engines' settings.

Stage settings (a profile's per-stage dict) hold an optional "engine" dict that overrides the
kit's engine defaults (`kit.engine_stage.ENGINE_DEFAULTS`); everything else is stage-specific.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.engines.vllm import EngineSettings
from pipeline.families.kit.engine_stage import ENGINE_DEFAULTS
from pipeline.stage import StageContext

FAMILY_DIR = "tiny"


def part_dir(ctx: StageContext, part: str) -> Path:
    """The built model directory of one part (thinker, talker, voicebox); clear error if absent."""
    directory = Path(ctx.models_dir) / FAMILY_DIR / part
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"tiny family not built at {directory.parent}: run "
            f"pipeline.families.tiny.build_tiny({ctx.models_dir!r}) first")
    return directory


def engine_settings(ctx: StageContext, part: str, **defaults: Any) -> EngineSettings:
    """Kit defaults, then the stage's own defaults, then the profile's "engine" overrides."""
    merged = {**ENGINE_DEFAULTS, **defaults, **ctx.settings.get("engine", {})}
    merged["model"] = str(part_dir(ctx, part))
    return EngineSettings.from_mapping(merged)
