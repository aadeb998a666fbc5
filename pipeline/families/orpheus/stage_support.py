"""Where the orpheus stages find their models, and the Talker's engine settings.

A stage's model directory is its `model_dir` setting when the profile gives one (a real
checkpoint), else its part of the built tiny family, `<models_dir>/orpheus/<part>`.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.engines.vllm import EngineSettings
from pipeline.families.orpheus.codes import AUDIO_IDS
from pipeline.families.tiny.stage_support import ENGINE_DEFAULTS
from pipeline.stage import StageContext

FAMILY_DIR = "orpheus"
TALKER_ENGINE = {"enable_prompt_embeds": False, "skip_tokenizer_init": True,
                 "max_model_len": 2048}  # token prompts; the stage tokenizes itself


def model_dir(ctx: StageContext, part: str) -> Path:
    """The stage's model directory; a clear error if it holds no config.json."""
    directory = Path(ctx.settings.get("model_dir") or Path(ctx.models_dir) / FAMILY_DIR / part)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"no {part} model at {directory}: run `omnivox models build orpheus-tiny` or set "
            f"the {part} stage's model_dir to a checkpoint directory")
    return directory


def talker_engine(ctx: StageContext) -> EngineSettings:
    """Family engine defaults for a token-prompt Talker, then the profile's overrides."""
    merged = {**ENGINE_DEFAULTS, **TALKER_ENGINE, **ctx.settings.get("engine", {})}
    merged["model"] = str(check_talker(model_dir(ctx, "talker")))
    return EngineSettings.from_mapping(merged)


def check_talker(directory: Path) -> Path:
    """`directory`, if its config.json is a Llama with Orpheus's audio ids; else a clear error
    (before an engine loads a model it cannot speak with)."""
    config = json.loads((directory / "config.json").read_text())
    architectures = config.get("architectures") or []
    if "LlamaForCausalLM" not in architectures or config.get("vocab_size", 0) < AUDIO_IDS.stop:
        raise ValueError(
            f"{directory} is not an Orpheus talker: it needs a LlamaForCausalLM with at least "
            f"{AUDIO_IDS.stop} ids (its audio ids), not {architectures} with "
            f"{config.get('vocab_size')}")
    return directory
