"""The check a server makes before it loads a model version (pipeline/model_version.py), and
what a version's manifest declares.

A version is loaded only when its manifest's engine range admits the running vLLM and torch and
every file still has the sha256 the build recorded; otherwise it is refused with one line that
says why and the command that rebuilds it.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from pipeline.engine_range import ENGINES, excluded_engines, running_engines
from pipeline.families.kit.build_support import (
    MANIFEST,
    file_digests,
    files_checksum,
    read_manifest,
)
from pipeline.model_version import FIRST_VERSION, ModelVersion

logger = logging.getLogger(__name__)

# The manifest key of a version's declared output schema: the JSON schema its answers follow,
# which a rollout's canary checks a guided completion of it against.
OUTPUT_SCHEMA = "output_schema"


class ModelVersionError(Exception):
    """A model version that must not be loaded; the message is one line saying why and how to
    rebuild it."""


def built_manifest(version: ModelVersion, family: str) -> dict[str, Any] | None:
    """The manifest of `family` built for `version`; None while it is not built (or
    unreadable: the build then redoes it)."""
    try:
        return read_manifest(version.root / family)
    except (OSError, ValueError):
        return None


def rebuild_command(family: str, version: ModelVersion, manifest: dict[str, Any] | None) -> str:
    """The command that (re)builds this version as it was built."""
    command = f"omnivox models build {family}"
    if version.number != FIRST_VERSION:
        command += f" --version {version}"
        if manifest is not None and manifest.get("seed") is not None:
            command += f" --seed {manifest['seed']}"
    return f"{command} --models-dir {version.models_dir}"


def check_engines(family: str, version: ModelVersion, manifest: dict[str, Any]) -> None:
    """Refuse a version whose engine range excludes the running vLLM or torch."""
    excluded = excluded_engines(manifest.get(ENGINES) or {})
    if excluded:
        raise ModelVersionError(
            f"refusing {family} version {version} at {version.root / family}: its "
            f"engine range excludes {'; '.join(excluded)} (running: {_engines_words()}); "
            f"rebuild it under these engines: "
            f"{rebuild_command(family, version, manifest)}")


def verify_checksum(family: str, version: ModelVersion, manifest: dict[str, Any]) -> str:
    """The version's checksum, once every file is the one its build recorded; refuses naming the
    files that differ, are missing or were added."""
    directory = version.root / family
    recorded: dict[str, str] = manifest.get("files") or {}
    problem = _changed_files(file_digests(directory), recorded)
    if problem is None and files_checksum(recorded) != manifest.get("checksum"):
        problem = f"{MANIFEST}'s checksum does not match its files' digests"
    if problem is not None:
        raise ModelVersionError(
            f"refusing {family} version {version} at {directory}: {problem}; "
            f"rebuild it: {rebuild_command(family, version, manifest)}")
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


def verify_version(family: str, version: ModelVersion) -> dict[str, Any] | None:
    """Check a built version before it is loaded (the engine range first: it costs nothing);
    its manifest, or None when there is nothing to check: not built, or built before engine
    ranges were recorded (such a build is redone by the family's build)."""
    manifest = built_manifest(version, family)
    if manifest is None and version.number != FIRST_VERSION:
        raise ModelVersionError(
            f"{family} version {version} is not built at {version.root / family}: build "
            f"it with {rebuild_command(family, version, None)} --seed N")
    if manifest is None or ENGINES not in manifest:
        return None
    check_engines(family, version, manifest)
    checksum = verify_checksum(family, version, manifest)
    logger.info("%s version %s: checksum %s, built for %s, running %s", family,
                version, checksum[:12], manifest[ENGINES], running_engines())
    return manifest


def declared_output_schema(version: ModelVersion, family: str) -> dict[str, Any] | None:
    """The output schema `version` declares (None: none declared)."""
    schema = (built_manifest(version, family) or {}).get(OUTPUT_SCHEMA)
    return schema if isinstance(schema, dict) else None


def declare_output_schema(version: ModelVersion, family: str, schema: dict[str, Any]) -> None:
    """Record `schema` in the built version's manifest. Its checksum covers the files, not the
    manifest, so the version stays the one that was built; written whole (renamed over)."""
    path = version.root / family / MANIFEST
    manifest = {**read_manifest(path.parent), OUTPUT_SCHEMA: schema}
    temporary = path.with_name(f".{MANIFEST}.tmp")
    temporary.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(temporary, path)
