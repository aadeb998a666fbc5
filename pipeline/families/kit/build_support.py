"""The build steps every model family shares: a checksummed manifest, a lock, a staging directory.

A family's build writes its files into a staging directory and, last, `manifest.json` (what it
was built from, the sha256 of every file and the engine range it was built for:
`pipeline.engine_range`); the staging directory is then renamed into place.
All of it runs under an exclusive file lock, so a crashed or concurrent build never leaves a
half-written family behind. A family whose manifest still matches its files, and whose engine
range admits the running engines, is not rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.engine_range import ENGINES, engine_range, range_admits_running

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def build_once(models_dir: Path, family: str, is_current: Callable[[Path], bool],
               write: Callable[[Path], None]) -> Path:
    """The family's directory under `models_dir`, written by `write(staging)` unless current.

    `is_current(directory)` says whether an existing build can stay; `write` must end with
    `write_manifest`.
    """
    models_dir = Path(models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    target = models_dir / family
    with _locked(models_dir / f".{family}.lock"):
        if is_current(target):
            logger.info("%s family already built at %s (manifest matches)", family, target)
            return target
        staging = models_dir / f".{family}.build-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            write(staging)
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("built %s family at %s", family, target)
    return target


def write_manifest(root: Path, fields: Mapping[str, Any]) -> None:
    """Write the manifest: `fields` (family, recipe, what it was built from), the engine range
    of the running engines, then the files."""
    files = file_digests(root)
    write_json(root / MANIFEST, {**fields, ENGINES: engine_range(), "files": files,
                                 "checksum": files_checksum(files)})


def read_manifest(family_dir: Path) -> dict[str, Any]:
    """A built family's manifest."""
    manifest: dict[str, Any] = json.loads((Path(family_dir) / MANIFEST).read_text())
    return manifest


def manifest_matches(family_dir: Path, expected: Mapping[str, Any]) -> bool:
    """Whether the manifest holds these `expected` fields, its engine range admits the running
    engines (a manifest without one predates ranges) and the files are those it lists."""
    try:
        manifest = read_manifest(family_dir)
    except (OSError, ValueError):
        return False
    if any(manifest.get(key) != value for key, value in expected.items()):
        return False
    if not range_admits_running(manifest.get(ENGINES)):
        return False
    files = file_digests(family_dir)
    return files == manifest.get("files") and files_checksum(files) == manifest.get("checksum")


def write_json(path: Path, obj: Mapping[str, Any]) -> None:
    """Write `obj` as indented JSON (the layout of Hugging Face config files)."""
    path.write_text(json.dumps(obj, indent=2) + "\n")


def file_digests(root: Path) -> dict[str, str]:
    """The sha256 of every file below `root` but the manifest, by relative path."""
    digests = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            with path.open("rb") as file:
                digests[str(path.relative_to(root))] = hashlib.file_digest(
                    file, "sha256").hexdigest()
    return digests


def files_checksum(files: Mapping[str, str]) -> str:
    """The checksum of a build: the sha256 of its files' sha256s, by relative path."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` for the duration of a with-block (between processes)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
