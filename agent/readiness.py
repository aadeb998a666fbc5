"""Whether this server can take a call now, and if not, which stage is holding it back."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from agent.events import error_event


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


class EventSink(Protocol):
    def send_event(self, event: dict[str, Any]) -> None: ...


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


def stage_failed_event(stage: str, reason: str) -> dict[str, Any]:
    """The `error` event a live call gets when one of the stages is marked failed."""
    return error_event(
        f"stage {stage} failed and will not be restarted ({reason}); replies fail until the "
        f"server is restarted",
        code="stage_failed",
        error_type="server_error",
    )


def announce_stage_failures(pipeline: FailureSource, calls: Iterable[EventSink]) -> None:
    """Tell every live call, with an `error` event, when a stage is marked failed: its caller
    learns at once, not only when its next reply fails."""

    def announce(stage: str, reason: str) -> None:
        for call in list(calls):
            call.send_event(stage_failed_event(stage, reason))

    pipeline.on_stage_failed(announce)
