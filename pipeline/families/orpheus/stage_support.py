"""Where the orpheus stages find their models, and the Talker's engine settings.

A stage's model directory is its `model_dir` setting when the profile gives one, else its part
of the real checkpoint the build recorded (`--model-path`: release.py), else its part of the
built tiny family, `<models_dir>/orpheus/<part>`.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.engines.vllm import EngineSettings
from pipeline.families.kit.build_support import MANIFEST, read_manifest
from pipeline.families.kit.engine_stage import ENGINE_DEFAULTS
from pipeline.families.orpheus.release import check_talker
from pipeline.stage import StageContext

FAMILY_DIR = "orpheus"
TALKER_ENGINE = {"enable_prompt_embeds": False, "skip_tokenizer_init": True,
                 "max_model_len": 2048}  # token prompts; the stage tokenizes itself


def release_dir(ctx: StageContext) -> Path | None:
    """The real checkpoint the build recorded (`--model-path`); None: the tiny build."""
    built = Path(ctx.models_dir) / FAMILY_DIR
    release = read_manifest(built).get("release") if (built / MANIFEST).is_file() else None
    return None if release is None else Path(release)


def model_dir(ctx: StageContext, part: str) -> Path:
    """The stage's model directory; a clear error if it holds no config.json."""
    built = Path(ctx.models_dir) / FAMILY_DIR
    directory = Path(ctx.settings.get("model_dir") or (release_dir(ctx) or built) / part)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"no {part} model at {directory}: run `omnivox models build orpheus-tiny`, serve "
            f"the orpheus profile with --model-path, or set the {part} stage's model_dir")
    return directory


def talker_engine(ctx: StageContext) -> EngineSettings:
    """Family engine defaults for a token-prompt Talker, then the profile's overrides."""
    merged = {**ENGINE_DEFAULTS, **TALKER_ENGINE, **ctx.settings.get("engine", {})}
    merged["model"] = str(check_talker(model_dir(ctx, "talker")))
    return EngineSettings.from_mapping(merged)
