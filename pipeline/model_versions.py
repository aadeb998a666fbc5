"""Model versions on disk, and the check a server makes before it loads one.

Version 1 of a family lives where builds have always put it, `<models_dir>/<family>/`; version
N > 1 lives in a models directory of its own, `<models_dir>/versions/N/<family>/`, so a stage
serving it reads it exactly as it reads version 1 (its `models_dir` is the version's root).
A version is loaded only when its manifest's engine range admits the running vLLM and torch and
every file still has the sha256 the build recorded.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from pipeline.engine_range import ENGINES, excluded_engines, running_engines
from pipeline.families.build_support import (
    MANIFEST,
    file_digests,
    files_checksum,
    read_manifest,
)

logger = logging.getLogger(__name__)

FIRST_VERSION = "1"
VERSIONS_DIR = "versions"
# The manifest key of a version's declared output schema: the JSON schema its answers follow,
# which a rollout's canary checks a guided completion of it against.
OUTPUT_SCHEMA = "output_schema"


class ModelVersionError(Exception):
    """A model version that must not be loaded; the message is one line saying why and how to
    rebuild it."""


def version_root(models_dir: Path, version: str) -> Path:
    """The models directory a version's stages read (`<models_dir>` for version 1)."""
    models_dir = Path(models_dir)
    return models_dir if version == FIRST_VERSION else models_dir / VERSIONS_DIR / version


def version_of(root: Path) -> str:
    """The version whose root `root` is (the inverse of `version_root`)."""
    root = Path(root)
    is_version = root.parent.name == VERSIONS_DIR and root.name.isdigit()
    return root.name if is_version else FIRST_VERSION


def built_manifest(root: Path, family: str) -> dict[str, Any] | None:
    """The manifest of `family` built under `root`; None while it is not built (or unreadable:
    the build then redoes it)."""
    try:
        return read_manifest(Path(root) / family)
    except (OSError, ValueError):
        return None


def rebuild_command(family: str, root: Path, manifest: dict[str, Any] | None) -> str:
    """The command that (re)builds this version as it was built."""
    version = version_of(root)
    command = f"omnivox models build {family}"
    if version != FIRST_VERSION:
        command += f" --version {version}"
        if manifest is not None and manifest.get("seed") is not None:
            command += f" --seed {manifest['seed']}"
    models_dir = root if version == FIRST_VERSION else root.parent.parent
    return f"{command} --models-dir {models_dir}"


def check_engines(family: str, root: Path, manifest: dict[str, Any]) -> None:
    """Refuse a version whose engine range excludes the running vLLM or torch."""
    excluded = excluded_engines(manifest.get(ENGINES) or {})
    if excluded:
        raise ModelVersionError(
            f"refusing {family} version {version_of(root)} at {Path(root) / family}: its "
            f"engine range excludes {'; '.join(excluded)} (running: {_engines_words()}); "
            f"rebuild it under these engines: "
            f"{rebuild_command(family, root, manifest)}")


def verify_checksum(family: str, root: Path, manifest: dict[str, Any]) -> str:
    """The version's checksum, once every file is the one its build recorded; refuses naming the
    files that differ, are missing or were added."""
    directory = Path(root) / family
    recorded: dict[str, str] = manifest.get("files") or {}
    problem = _changed_files(file_digests(directory), recorded)
    if problem is None and files_checksum(recorded) != manifest.get("checksum"):
        problem = f"{MANIFEST}'s checksum does not match its files' digests"
    if problem is not None:
        raise ModelVersionError(
            f"refusing {family} version {version_of(root)} at {directory}: {problem}; "
            f"rebuild it: {rebuild_command(family, root, manifest)}")
    return str(manifest["checksum"])


def _changed_files(actual: dict[str, str], recorded: dict[str, str]) -> str | None:
    """Which files are not the ones the build recorded, in words; None when all are."""
    changed = sorted(name for name in actual.keys() & recorded.keys()
                     if actual[name] != recorded[name])
    missing, added = sorted(recorded.keys() - actual.keys()), sorted(actual.keys() - recorded)
    words = []
    if changed:
        words.append(f"file {', '.join(changed)} does not match the sha256 its build recorded")
    if missing:
        words.append(f"file {', '.join(missing)} is missing")
    if added:
        words.append(f"file {', '.join(added)} is not in its {MANIFEST}")
    return "; ".join(words) or None


def _engines_words() -> str:
    return ", ".join(f"{name} {version}" for name, version in running_engines().items())


def verify_version(family: str, root: Path) -> dict[str, Any] | None:
    """Check a built version before it is loaded (the engine range first: it costs nothing);
    its manifest, or None when there is nothing to check: not built, or built before engine
    ranges were recorded (such a build is redone by the family's build)."""
    manifest = built_manifest(root, family)
    if manifest is None and version_of(root) != FIRST_VERSION:
        raise ModelVersionError(
            f"{family} version {version_of(root)} is not built at {Path(root) / family}: build "
            f"it with {rebuild_command(family, root, None)} --seed N")
    if manifest is None or ENGINES not in manifest:
        return None
    check_engines(family, root, manifest)
    checksum = verify_checksum(family, root, manifest)
    logger.info("%s version %s: checksum %s, built for %s, running %s", family,
                version_of(root), checksum[:12], manifest[ENGINES], running_engines())
    return manifest


def declared_output_schema(root: Path, family: str) -> dict[str, Any] | None:
    """The output schema the version built under `root` declares (None: none declared)."""
    schema = (built_manifest(root, family) or {}).get(OUTPUT_SCHEMA)
    return schema if isinstance(schema, dict) else None


def declare_output_schema(root: Path, family: str, schema: dict[str, Any]) -> None:
    """Record `schema` in the built version's manifest. Its checksum covers the files, not the
    manifest, so the version stays the one that was built; written whole (renamed over)."""
    path = Path(root) / family / MANIFEST
    manifest = {**read_manifest(path.parent), OUTPUT_SCHEMA: schema}
    temporary = path.with_name(f".{MANIFEST}.tmp")
    temporary.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(temporary, path)
