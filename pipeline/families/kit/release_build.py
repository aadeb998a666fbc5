"""The build of a family derived from a release directory (the omni families): its manifest's
fields, where its release lies once built, and the build's steps run under a progress bar.

The manifest's "release" says where the release is: TINY_RELEASE (inside the family directory,
the tiny random one the build writes) or the absolute path of a real one, read where it lies
and never copied."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from pipeline.families.kit.build_support import MANIFEST, read_manifest

logger = logging.getLogger(__name__)

TINY_RELEASE = "release"  # the tiny release's place inside the family directory
Step = tuple[str, Callable[[], None]]


def release_fields(family: str, recipe: str, seed: int, release: Path | None) -> dict[str, Any]:
    """The manifest fields of a build from `release` (None: the tiny one, from `seed`)."""
    return {"family": family, "recipe": recipe,
            "seed": seed if release is None else None,
            "release": TINY_RELEASE if release is None else str(release)}


def built_family_dir(models_dir: Path | str, family: str, label: str) -> Path:
    """The built family's directory under `models_dir`; a clear error if it is not built
    (`label`: what a real release of it is called)."""
    family_dir = Path(models_dir) / family
    if not (family_dir / MANIFEST).is_file():
        raise FileNotFoundError(
            f"{family} family not built at {family_dir}: run "
            f"pipeline.families.{family}.build({str(models_dir)!r}) first (release=<a "
            f"{label} directory> for real weights)")
    return family_dir


def release_dir(family_dir: Path) -> Path:
    """The release a built family was derived from (its manifest's "release")."""
    family_dir = Path(family_dir)
    return family_dir / str(read_manifest(family_dir)["release"])  # absolute stays itself


def run_steps(family: str, steps: Sequence[Step], progress: bool) -> None:
    """Run a build's named steps in order, under a progress bar unless `progress` is off."""
    for name, step in tqdm(steps, desc=f"building {family} family", unit="step",
                           disable=not progress):
        logger.debug("%s build: %s", family, name)
        step()
