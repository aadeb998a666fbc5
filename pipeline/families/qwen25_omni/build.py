"""Builds the qwen25_omni family's directory: a release plus the parts derived from it.

Layout under `<models_dir>/qwen25_omni/`: release/ (the tiny random release, when no real one
is given: `release.write_tiny_release`), thinker_lm/ (the thinker's language model as a plain
Qwen2ForCausalLM for vLLM: `thinker_lm`), talker_lm/ with its talker_extra/ (the talker converted
for vLLM: `talker_lm`) and manifest.json, whose "release" field says where
the release is: "release" (inside, tiny) or the absolute path of a real one, which is read
where it lies and never copied. A build whose manifest still matches is skipped; otherwise it
is rebuilt whole in a staging directory under a file lock (`build_support.build_once`).
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
from pipeline.families.qwen25_omni.release import check_release, write_tiny_release
from pipeline.families.qwen25_omni.talker_lm import LM_DIR as TALKER_LM
from pipeline.families.qwen25_omni.talker_lm import convert_talker
from pipeline.families.qwen25_omni.thinker_lm import write_thinker_lm

logger = logging.getLogger(__name__)

FAMILY = "qwen25_omni"
RECIPE = "qwen25-omni-3"  # bump when the build changes what it writes: old builds are rebuilt
SEED = 2025
TINY_RELEASE = "release"  # the tiny release's place inside the family directory
THINKER_LM = "thinker_lm"


def build_qwen25_omni(models_dir: Path, progress: bool = True, seed: int = SEED,
                      release: Path | None = None, dummy_weights: bool = False) -> Path:
    """Build (or find already built) the family under `models_dir`; its directory.

    `release`: a real Qwen2.5-Omni release directory (checked first); None builds the tiny
    random one from `seed`. `dummy_weights`: the release is weightless (`real_size.py`), and
    so are the parts derived from it where a conversion only renames.
    """
    if release is not None:
        release = Path(release).resolve()
        check_release(release)
    fields = {"family": FAMILY, "recipe": RECIPE,
              "seed": seed if release is None else None,
              "release": TINY_RELEASE if release is None else str(release)}
    if dummy_weights:  # only then: builds from before the option still match
        fields["dummy_weights"] = True
    return build_once(models_dir, FAMILY, lambda target: manifest_matches(target, fields),
                      lambda staging: _write_all(staging, release, fields, progress))


def built_family(models_dir: Path | str) -> Path:
    """The built family's directory under `models_dir`; a clear error if it is not built."""
    family_dir = Path(models_dir) / FAMILY
    if not (family_dir / MANIFEST).is_file():
        raise FileNotFoundError(
            f"qwen25_omni family not built at {family_dir}: run "
            f"pipeline.families.qwen25_omni.build({str(models_dir)!r}) first (release=<a "
            "Qwen2.5-Omni directory> for real weights)")
    return family_dir


def release_dir(family_dir: Path) -> Path:
    """The release a built family was derived from (its manifest's "release")."""
    family_dir = Path(family_dir)
    return family_dir / str(read_manifest(family_dir)["release"])  # absolute stays itself


def _write_all(root: Path, release: Path | None, fields: dict, progress: bool) -> None:
    source = release or root / TINY_RELEASE
    steps: list[tuple[str, Callable[[], None]]] = []
    if release is None:
        steps.append(("tiny release (random weights)",
                      lambda: write_tiny_release(source, int(fields["seed"]))))
    steps += [
        ("thinker LM", lambda: write_thinker_lm(source, root / THINKER_LM,
                                                bool(fields.get("dummy_weights")))),
        ("talker LM", lambda: convert_talker(source, root / TALKER_LM)),
        ("manifest", lambda: write_manifest(root, fields)),
    ]
    for name, step in tqdm(steps, desc="building qwen25_omni family", unit="step",
                           disable=not progress):
        logger.debug("qwen25_omni build: %s", name)
        step()
