"""The model versions this server runs at once (`name@version`, each its own pipeline: its own
stage workers on its own models directory), the default each name's unpinned callers get, and
who uses each version now (live calls and requests), which a drain or a retire waits for.

For what the app checks of "its" pipeline (readiness, /metrics, stage-failure announcements)
the registry stands in for the default version's pipeline, whichever that is now.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.model_version import ModelVersion


class VersionState(enum.StrEnum):
    STARTING = "starting"  # its workers are starting (a rollout's new version)
    CHECKING = "checking"  # ready, its canary turns running: no caller is sent to it yet
    SERVING = "serving"
    DRAINING = "draining"  # no new caller; those on it finish there, then its workers stop


@dataclass(eq=False)
class ServedVersion:
    """One version of one model and the pipeline that serves it."""

    name: str
    model: ModelVersion
    family: str
    pipeline: Any
    owned: bool  # started by the registry (a rollout): the registry stops it
    state: VersionState = VersionState.SERVING
    # The live calls' bindings to it (binding.py): a call keeps the version it started on.
    bindings: set[Any] = field(default_factory=set)

    @property
    def version(self) -> str:
        return self.model.number

    @property
    def root(self) -> Path:
        """The models directory its stages read."""
        return self.model.root

    @property
    def id(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def calls(self) -> int:
        return len(self.bindings)


@dataclass
class Split:
    """Part of a name's unpinned new callers sent to another version (a red-black shift)."""

    version: str
    percent: int


class ModelRegistry:
    """Served versions by id, each name's default, and the traffic split of a shift."""

    def __init__(self, primary: str) -> None:
        self.primary = primary  # the profile's name: what readiness and /metrics follow
        self._versions: dict[str, ServedVersion] = {}
        self._defaults: dict[str, str] = {}
        self._splits: dict[str, Split] = {}
        self._failure_listeners: list[Callable[[str, str], None]] = []
        self._heard: set[int] = set()  # the pipelines the listeners are on (by id), once each

    def add(self, served: ServedVersion, *, default: bool = False) -> None:
        self._versions[served.id] = served
        if default or served.name not in self._defaults:
            self._defaults[served.name] = served.version
        self._listen(served.pipeline, self._failure_listeners)

    def remove(self, model_id: str) -> ServedVersion | None:
        return self._versions.pop(model_id, None)

    def versions(self) -> list[ServedVersion]:
        return list(self._versions.values())

    def get(self, model_id: str) -> ServedVersion | None:
        return self._versions.get(model_id)

    def default(self, name: str) -> ServedVersion | None:
        version = self._defaults.get(name)
        return None if version is None else self._versions.get(f"{name}@{version}")

    def is_default(self, served: ServedVersion) -> bool:
        return self._defaults.get(served.name) == served.version

    def set_default(self, served: ServedVersion) -> None:
        self._defaults[served.name] = served.version

    def split(self, name: str, version: str | None, percent: int = 0) -> None:
        """Send `percent` of `name`'s unpinned new callers to `version` (None: no split)."""
        if version is None:
            self._splits.pop(name, None)
        else:
            self._splits[name] = Split(version, percent)

    def shifted(self, name: str) -> Split | None:
        return self._splits.get(name)

    def resolve(self, model_id: str) -> ServedVersion | None:
        """The version `model_id` names: `name@version` exactly (a draining one still serves
        those pinned to it), or for a bare name its default, or the version a shift sends this
        caller to. None when not served."""
        name, pinned, _ = model_id.partition("@")
        if pinned:
            served = self._versions.get(model_id)
            ok = served is not None and served.state in (VersionState.SERVING,
                                                        VersionState.DRAINING)
            return served if ok else None
        split = self._splits.get(name)
        if split is not None and random.uniform(0, 100) < split.percent:
            shifted = self._versions.get(f"{name}@{split.version}")
            if shifted is not None and shifted.state == VersionState.SERVING:
                return shifted
        return self.default(name)

    # -- the default pipeline, as the app's readiness, metrics and calls see it ---------

    def _primary_pipeline(self) -> Any:
        served = self.default(self.primary)
        return None if served is None else served.pipeline

    def health(self) -> Any:
        return self._primary_pipeline().health()

    @property
    def pool(self) -> Any:
        return getattr(self._primary_pipeline(), "pool", None)

    def on_stage_failed(self, listener: Callable[[str, str], None]) -> None:
        """Hear of a stage given up for good in any version, served now or later."""
        self._failure_listeners.append(listener)
        for served in self._versions.values():
            served.pipeline.on_stage_failed(listener)

    def _listen(self, pipeline: Any, listeners: list[Callable[[str, str], None]]) -> None:
        """Put the failure listeners on a pipeline new to the registry (one served again
        after a retire has them already)."""
        if id(pipeline) in self._heard or not hasattr(pipeline, "on_stage_failed"):
            return
        self._heard.add(id(pipeline))
        for listener in listeners:
            pipeline.on_stage_failed(listener)

    def __iter__(self) -> Iterator[ServedVersion]:
        return iter(self.versions())
