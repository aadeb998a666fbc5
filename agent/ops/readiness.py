"""Whether this server can take a call now, and if not, which stage is holding it back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class StageStatusLike(Protocol):
    state: str  # starting | ready | restarting | failed
    reason: str | None
    restarts: int


class HealthLike(Protocol):
    ready: bool
    stages: dict[str, StageStatusLike]


class HealthSource(Protocol):
    def health(self) -> HealthLike: ...


class FailureSource(Protocol):
    def on_stage_failed(self, listener: Callable[[str, str], None]) -> None: ...


class Readiness:
    """Readiness of every stage the server depends on (none: a media-only server)."""

    def __init__(self, pipeline: HealthSource | None) -> None:
        self.pipeline = pipeline

    def stages(self) -> dict[str, dict[str, Any]]:
        if self.pipeline is None:
            return {}
        stages = self.pipeline.health().stages
        if not stages:
            return {"pipeline": {"state": "starting", "reason": "preparing models and workers",
                                 "restarts": 0}}
        return {name: {"state": s.state, "reason": s.reason, "restarts": s.restarts}
                for name, s in stages.items()}

    def ready(self) -> bool:
        return all(s["state"] == "ready" for s in self.stages().values())

    def failed(self) -> list[str]:
        """Stages given up for good (they will not be restarted: an operator must act)."""
        return [name for name, s in self.stages().items() if s["state"] == "failed"]

    def summary(self) -> str:
        waiting = [
            f"{name} is {s['state']}" + (f" ({s['reason']})" if s["reason"] else "")
            for name, s in self.stages().items()
            if s["state"] != "ready"
        ]
        return "; ".join(waiting) or "ready"
