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
    version (settings.models_dir for version 1: pipeline.model_versions)."""
    profiles = load_profiles()
    profile = profiles.get(settings.profile)
    if profile is None:
        known = ", ".join(sorted(profiles))
        raise ProfileError(f"unknown profile {settings.profile!r} (known: {known})")
    fields = {k: v for k, v in profile.items() if k != "description"}
    fields["models_dir"] = version_root(settings.models_dir, settings.model_version)
    return PipelineSettings.model_validate({**fields, **(overrides or {})})


def build_pipeline(settings: Settings, overrides: dict[str, Any] | None = None) -> Pipeline:
    """The stage pipeline for the settings' profile (not started)."""
    return Pipeline(pipeline_settings(settings, overrides))
