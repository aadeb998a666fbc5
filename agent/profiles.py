"""Model profiles: which family serves each stage, and how to build its models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.config import Settings


def build_pipeline(settings: Settings) -> Any | None:
    """The stage pipeline for the settings' profile (none until the stage runtime lands)."""
    return None


def build_models(settings: Settings, family: str) -> Path:
    raise SystemExit(f"omnivox: no model family {family!r} can be built yet")
