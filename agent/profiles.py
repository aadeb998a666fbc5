"""Model profiles (agent/profiles.toml): which family serves the stages, with which settings."""

from __future__ import annotations

import functools
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

from agent.config import AliasSettings, Settings
from pipeline.settings import PipelineSettings
from pipeline.turns.orchestrator import Pipeline

PROFILES_FILE = Path(__file__).with_name("profiles.toml")


class ProfileError(ValueError):
    """An unknown or malformed profile."""


def load_profiles(path: Path = PROFILES_FILE) -> dict[str, dict[str, Any]]:
    with path.open("rb") as f:
        return tomllib.load(f)


def pipeline_settings(
    settings: Settings, overrides: dict[str, Any] | None = None
) -> PipelineSettings:
    """The pipeline settings of the server's profile, serving its version
    (settings.model_version) of the models under settings.models_dir. A profile with
    `real_weights` serves the checkpoint at settings.model_path, its derived parts built under
    `<models_dir>/<profile>`; the others build their own weights and refuse a model_path.
    A profile's `gpu` table is laid over its settings when it runs on a GPU (`on_gpu`)."""
    profiles = load_profiles()
    profile = profiles.get(settings.profile)
    if profile is None:
        known = ", ".join(sorted(profiles))
        raise ProfileError(f"unknown profile {settings.profile!r} (known: {known})")
    fields = {k: v for k, v in profile.items()
              if k not in ("description", "real_weights", "gpu", "aliases")}
    if "gpu" in profile and on_gpu(settings):
        fields = overlaid(fields, profile["gpu"])
    models_dir = Path(settings.models_dir)
    if profile.get("real_weights"):
        if settings.model_path is None:
            raise ProfileError(f"profile {settings.profile!r} serves real weights: give their "
                               "directory with --model-path (or OMNIVOX_MODEL_PATH)")
        fields["model_path"] = Path(settings.model_path).resolve()
        models_dir = models_dir / settings.profile
    elif settings.model_path is not None:
        real = ", ".join(sorted(n for n, p in profiles.items() if p.get("real_weights")))
        raise ProfileError(f"profile {settings.profile!r} builds its own weights; "
                           f"--model-path is for the profiles that serve real ones ({real})")
    fields["models_dir"] = models_dir
    fields["model_version"] = settings.model_version
    # The prompt most calls start with is in the Thinker's prefix cache before the first one.
    fields.setdefault("warm_up", settings.conversation.instructions)
    return PipelineSettings.model_validate({**fields, **(overrides or {})})


def with_profile_aliases(settings: Settings) -> Settings:
    """`settings` with its profile's alias table (`[NAME.aliases]`) laid over its own."""
    table = load_profiles().get(settings.profile, {}).get("aliases", {})
    aliases = profile_aliases(settings.aliases, table)
    return settings if aliases is settings.aliases else settings.model_copy(
        update={"aliases": aliases})


def profile_aliases(base: AliasSettings, profile: dict[str, Any]) -> AliasSettings:
    """`base` with a profile's `aliases` table laid over it, table by table, except where
    `base` was set explicitly (the environment or the command line win over a profile)."""
    over = {key: value for key, value in profile.items() if key not in base.model_fields_set}
    if not over:
        return base
    merged = base.model_dump()
    for key, value in over.items():
        merged[key] = {**merged[key], **value} if isinstance(value, dict) else value
    return AliasSettings.model_validate(merged)


def needs_gpu(name: str) -> bool:
    """Whether the profile `name` is sized for a GPU (it has a `gpu` table)."""
    return "gpu" in load_profiles().get(name, {})


def on_gpu(settings: Settings) -> bool:
    """Whether the server runs its profile's GPU settings: told so, or a GPU answers."""
    return settings.device == "cuda" or (settings.device == "auto" and gpu_answers())


@functools.cache
def gpu_answers() -> bool:
    """An NVIDIA GPU answers `nvidia-smi -L` (setup's own test for the CUDA vLLM build)."""
    command = shutil.which("nvidia-smi")
    if command is None:
        return False
    found = subprocess.run([command, "-L"], capture_output=True, timeout=30, check=False)
    return found.returncode == 0


def overlaid(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s values laid on it, tables merged key by key."""
    result = dict(base)
    for key, value in over.items():
        below = result.get(key)
        both_tables = isinstance(below, dict) and isinstance(value, dict)
        result[key] = overlaid(below, value) if both_tables else value  # type: ignore[arg-type]
    return result


def build_pipeline(settings: Settings, overrides: dict[str, Any] | None = None) -> Pipeline:
    """The stage pipeline for the settings' profile (not started)."""
    return Pipeline(pipeline_settings(settings, overrides))
