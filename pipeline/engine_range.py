"""The engine range a model version is built for: vLLM and torch version specifiers, recorded
in its manifest at build time from the versions running then, and checked before it is served.

A build records each engine's running minor release (`vllm: >=0.32,<0.33`): a patch release
of an engine keeps serving it, a new minor release, where engines change their model loading,
does not until the version is rebuilt under it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata as metadata
from collections.abc import Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from pipeline.engines.pins import EngineVersionError, installed_vllm

ENGINES = "engines"  # the manifest's field: engine name -> specifier


def running_engines() -> dict[str, str]:
    """The installed vLLM (whichever of its distributions) and torch, by engine name; an engine
    that is not installed is left out."""
    return dict(_installed_engines())


@functools.cache  # read once (ms of metadata scans): what a process imported does not change
def _installed_engines() -> tuple[tuple[str, str], ...]:
    versions = {}
    with contextlib.suppress(EngineVersionError):
        versions["vllm"] = installed_vllm()[1]
    with contextlib.suppress(metadata.PackageNotFoundError):
        versions["torch"] = metadata.version("torch")
    return tuple(versions.items())


def engine_range(running: Mapping[str, str] | None = None) -> dict[str, str]:
    """The range a build made now records: each running engine's minor release."""
    return {name: minor_release(version)
            for name, version in (running_engines() if running is None else running).items()}


def minor_release(version: str) -> str:
    """`>=X.Y,<X.Y+1` around `version` (`2.13.0+cpu` -> `>=2.13,<2.14`)."""
    major, minor = (*Version(version).release, 0)[:2]
    return f">={major}.{minor},<{major}.{minor + 1}"


def excluded_engines(declared: Mapping[str, str],
                     running: Mapping[str, str] | None = None) -> list[str]:
    """Each running engine the declared range excludes, as `vllm 0.33.0 (built for
    vllm>=0.32,<0.33)`; an engine the range does not name, or that is not installed, is not
    checked. A specifier that does not parse excludes everything (it cannot be trusted)."""
    running = running_engines() if running is None else running
    excluded = []
    for name, specifier in declared.items():
        version = running.get(name)
        if version is not None and not _admits(specifier, version):
            excluded.append(f"{name} {version} (built for {name}{specifier})")
    return excluded


def range_admits_running(declared: object) -> bool:
    """Whether a manifest's recorded range (None in a build older than ranges) admits the
    running engines: a build must be redone when it does not."""
    return isinstance(declared, Mapping) and not excluded_engines(declared)


def _admits(specifier: str, version: str) -> bool:
    try:
        return SpecifierSet(specifier).contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False
