"""Whether this server can take a call now, and if not, which stage is holding it back."""

from __future__ import annotations

from typing import Any, Protocol


class StageHealthLike(Protocol):
    state: str  # starting | ready | restarting | failed
    reason: str | None


class HealthSource(Protocol):
    def health(self) -> dict[str, StageHealthLike]: ...


class Readiness:
    """Readiness of every stage the server depends on."""

    def __init__(self, pipeline: HealthSource | None) -> None:
        self.pipeline = pipeline

    def stages(self) -> dict[str, dict[str, Any]]:
        if self.pipeline is None:
            return {}
        return {
            name: {"state": h.state, "reason": h.reason}
            for name, h in self.pipeline.health().items()
        }

    def ready(self) -> bool:
        return all(s["state"] == "ready" for s in self.stages().values())

    def summary(self) -> str:
        waiting = [
            f"{name} is {s['state']}" + (f" ({s['reason']})" if s["reason"] else "")
            for name, s in self.stages().items()
            if s["state"] != "ready"
        ]
        return "; ".join(waiting) or "ready"
