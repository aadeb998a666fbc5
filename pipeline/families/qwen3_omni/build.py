"""Builds the qwen3_omni family's directory: a release, and (in later increments) the parts
derived from it.

Layout under `<models_dir>/qwen3_omni/`: release/ (the tiny random release, when no real one is
given: `release.write_tiny_release`) and manifest.json, whose "release" field says where the
release is: "release" (inside, tiny) or the absolute path of a real one, which is read where it
lies and never copied. A build whose manifest still matches is skipped; otherwise it is rebuilt
whole in a staging directory under a file lock (`build_support.build_once`). The family has no
stages yet (its code2wav renders in torch, `code2wav.py`), so the registry does not list it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from pipeline.families.kit.build_support import (
    MANIFEST,
    build_once,
    manifest_matches,
    read_manifest,
    write_manifest,
)
from pipeline.families.qwen3_omni.release import check_release, write_tiny_release

logger = logging.getLogger(__name__)

FAMILY = "qwen3_omni"
RECIPE = "qwen3-omni-1"  # bump when the build changes what it writes: old builds are rebuilt
SEED = 2025
TINY_RELEASE = "release"  # the tiny release's place inside the family directory


def build_qwen3_omni(models_dir: Path, progress: bool = True, seed: int = SEED,
                     release: Path | None = None) -> Path:
    """Build (or find already built) the family under `models_dir`; its directory.

    `release`: a real Qwen3-Omni release directory (checked first); None builds the tiny
    random one from `seed`.
    """
    if release is not None:
        release = Path(release).resolve()
        check_release(release)
    fields = {"family": FAMILY, "recipe": RECIPE,
              "seed": seed if release is None else None,
              "release": TINY_RELEASE if release is None else str(release)}
    return build_once(models_dir, FAMILY, lambda target: manifest_matches(target, fields),
                      lambda staging: _write_all(staging, release, fields, progress))


def built_family(models_dir: Path | str) -> Path:
    """The built family's directory under `models_dir`; a clear error if it is not built."""
    family_dir = Path(models_dir) / FAMILY
    if not (family_dir / MANIFEST).is_file():
        raise FileNotFoundError(
            f"qwen3_omni family not built at {family_dir}: run "
            f"pipeline.families.qwen3_omni.build({str(models_dir)!r}) first (release=<a "
            "Qwen3-Omni directory> for real weights)")
    return family_dir


def release_dir(family_dir: Path) -> Path:
    """The release a built family was derived from (its manifest's "release")."""
    family_dir = Path(family_dir)
    return family_dir / str(read_manifest(family_dir)["release"])  # absolute stays itself


def _write_all(root: Path, release: Path | None, fields: dict, progress: bool) -> None:
    steps: list[tuple[str, Callable[[], None]]] = []
    if release is None:
        steps.append(("tiny release (random weights)",
                      lambda: write_tiny_release(root / TINY_RELEASE, int(fields["seed"]))))
    steps.append(("manifest", lambda: write_manifest(root, fields)))
    for name, step in tqdm(steps, desc="building qwen3_omni family", unit="step",
                           disable=not progress):
        logger.debug("qwen3_omni build: %s", name)
        step()
