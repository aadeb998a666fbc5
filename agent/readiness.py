"""Whether this server can take a call now, and if not, which stage is holding it back."""

from __future__ import annotations

from typing import Any, Protocol


class StageStatusLike(Protocol):
    state: str  # starting | ready | restarting | failed
    reason: str | None


class HealthLike(Protocol):
    ready: bool
    stages: dict[str, StageStatusLike]


class HealthSource(Protocol):
    def health(self) -> HealthLike: ...


class Readiness:
    """Readiness of every stage the server depends on (none: a media-only server)."""

    def __init__(self, pipeline: HealthSource | None) -> None:
        self.pipeline = pipeline

    def stages(self) -> dict[str, dict[str, Any]]:
        if self.pipeline is None:
            return {}
        stages = self.pipeline.health().stages
        if not stages:
            return {"pipeline": {"state": "starting", "reason": "preparing models and workers"}}
        return {name: {"state": s.state, "reason": s.reason} for name, s in stages.items()}

    def ready(self) -> bool:
        return all(s["state"] == "ready" for s in self.stages().values())

    def summary(self) -> str:
        waiting = [
            f"{name} is {s['state']}" + (f" ({s['reason']})" if s["reason"] else "")
            for name, s in self.stages().items()
            if s["state"] != "ready"
        ]
        return "; ".join(waiting) or "ready"
