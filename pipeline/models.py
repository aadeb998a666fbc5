"""Making sure a model version is built and sound before its workers start.

A version already built is checked first (`pipeline.version_checks.verify_version`): a changed
file or an engine range that excludes the running vLLM/torch refuses it, never a silent
rebuild of the weights a server was told to serve. Then the family's own `build` decides: it
keeps a build whose manifest still matches and rebuilds a missing or stale one (a new recipe,
or a build older than engine ranges), with the seed the version was built from. It runs in a
spawned child process: it imports torch and writes weights, neither of which belongs in the API
process or on its event loop. Its progress bar goes to stderr.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import multiprocessing
from pathlib import Path
from typing import Any

from pipeline.model_version import ModelVersion
from pipeline.version_checks import ModelVersionError, built_manifest, verify_version

logger = logging.getLogger(__name__)


def build_family(family: str, models_dir: str, seed: int | None = None,
                 release: str | None = None) -> None:
    """Run the family's build (idempotent) under `models_dir` (a version's root), from `seed`
    or from the real checkpoint `release` when given. Child-process entry point."""
    from pipeline.families import load_family

    logging.basicConfig(level=logging.INFO)
    options = build_options(family, seed, Path(release) if release else None)
    load_family(family).build(Path(models_dir), progress=True, **options)


def build_options(family: str, seed: int | None, release: Path | None = None) -> dict[str, Any]:
    """The family build's keyword arguments for `seed` and a real checkpoint `release`;
    ValueError for a family that takes neither (packaged weights, or only its own)."""
    from pipeline.families import load_family

    takes = inspect.signature(load_family(family).build).parameters
    options: dict[str, Any] = {}
    if seed is not None:
        if "seed" not in takes:
            raise ValueError(f"the {family} family's weights are packaged, not made from a "
                             "seed: build it without --seed")
        options["seed"] = seed
    if release is not None:
        if "release" not in takes:
            raise ValueError(f"the {family} family serves no real checkpoint (--model-path)")
        options["release"] = release
    return options


def check_checkpoint(family: str, path: Path) -> None:
    """A real checkpoint directory checked before anything starts: FileNotFoundError or
    ValueError naming what is absent or of the wrong architecture."""
    from pipeline.families import load_family

    check = getattr(load_family(family), "check_checkpoint", None)
    if check is None:
        raise ValueError(f"the {family} family serves no real checkpoint (--model-path)")
    check(Path(path))


async def ensure_models(family: str, version: ModelVersion,
                        release: Path | None = None) -> None:
    """Check `version` as built, then build it (from the real checkpoint `release`, when
    given) unless it is current; test families (dotted modules) have nothing to build.
    ModelVersionError, logged as one line, when the version must not be loaded."""
    if "." in family:
        return
    try:
        await asyncio.to_thread(verify_version, family, version)
    except ModelVersionError as exc:
        logger.error("%s", exc)
        raise
    seed = (built_manifest(version, family) or {}).get("seed")  # rebuilt as it was built
    models_dir = version.root
    process = multiprocessing.get_context("spawn").Process(
        target=build_family, args=(family, str(models_dir), seed,
                                   str(release) if release else None),
        name=f"omnivox-build-{family}")
    process.start()
    await asyncio.to_thread(process.join)
    if process.exitcode != 0:
        raise RuntimeError(f"building the {family!r} models under {models_dir} failed "
                           f"(exit code {process.exitcode}; its traceback is above)")
