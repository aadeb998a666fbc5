"""Model profiles (agent/profiles.toml): which family serves the stages, with which settings."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from agent.config import Settings
from pipeline.model_versions import version_root
from pipeline.orchestrator import Pipeline
from pipeline.settings import PipelineSettings

PROFILES_FILE = Path(__file__).with_name("profiles.toml")


class ProfileError(ValueError):
    """An unknown or malformed profile."""


def load_profiles(path: Path = PROFILES_FILE) -> dict[str, dict[str, Any]]:
    with path.open("rb") as f:
        return tomllib.load(f)


def pipeline_settings(
    settings: Settings, overrides: dict[str, Any] | None = None
) -> PipelineSettings:
    """The pipeline settings of the server's profile, models under the root of its served
    version (settings.models_dir for version 1: pipeline.model_versions). A profile with
    `real_weights` serves the checkpoint at settings.model_path, its derived parts built under
    `<models_dir>/<profile>`; the others build their own weights and refuse a model_path."""
    profiles = load_profiles()
    profile = profiles.get(settings.profile)
    if profile is None:
        known = ", ".join(sorted(profiles))
        raise ProfileError(f"unknown profile {settings.profile!r} (known: {known})")
    fields = {k: v for k, v in profile.items() if k not in ("description", "real_weights")}
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
    fields["models_dir"] = version_root(models_dir, settings.model_version)
    return PipelineSettings.model_validate({**fields, **(overrides or {})})


def build_pipeline(settings: Settings, overrides: dict[str, Any] | None = None) -> Pipeline:
    """The stage pipeline for the settings' profile (not started)."""
    return Pipeline(pipeline_settings(settings, overrides))
