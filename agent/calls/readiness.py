"""Whether this server can take a call now, and if not, which stage (or a drain) is holding it
back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from agent.calls.admission import Admission


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


DRAINING = "draining: shutting down, live calls go on, new calls go to another server"


class Readiness:
    """Readiness of every stage the server depends on (none: a media-only server), and whether
    the server is draining (told to stop: it takes no new call, whatever its stages say)."""

    def __init__(self, pipeline: HealthSource | None, admission: Admission | None = None) -> None:
        self.pipeline = pipeline
        self.admission = admission
        self.draining = False
        # Why the call plane (the call workers) takes no call now, or None: set by the app.
        self.call_plane: Callable[[], str | None] | None = None
        self.failed_start: str | None = None  # why the start gave up, as heard
        self._failure_applies: Callable[[], bool] = lambda: True

    def start_failed(self, reason: str, applies: Callable[[], bool] | None = None) -> None:
        """The pipeline's start gave up (a model version refused, a build failed): no stage will
        come up until an operator acts, and /readyz says why, while `applies()` (by default
        always; a rollout to another version, which started, ends it)."""
        self.failed_start = reason
        self._failure_applies = applies or (lambda: True)

    @property
    def start_failure(self) -> str | None:
        """Why the start of the pipeline serving now gave up, or None."""
        return self.failed_start if self._failure_applies() else None

    def drain(self) -> None:
        """From now on refuse new calls; a plain flag, so a signal handler may call it."""
        self.draining = True

    def stages(self) -> dict[str, dict[str, Any]]:
        if self.pipeline is None:
            return {}
        failure = self.start_failure
        if failure is not None:
            return {"pipeline": {"state": "failed", "reason": failure, "restarts": 0}}
        stages = self.pipeline.health().stages
        if not stages:
            return {"pipeline": {"state": "starting", "reason": "preparing models and workers",
                                 "restarts": 0}}
        return {name: {"state": s.state, "reason": s.reason, "restarts": s.restarts}
                for name, s in stages.items()}

    def stages_ready(self) -> bool:
        return all(s["state"] == "ready" for s in self.stages().values())

    def full(self) -> str | None:
        """Why the call plane takes no more calls now (no call worker up, admission control),
        or None."""
        down = self.call_plane() if self.call_plane is not None else None
        if down is not None:
            return down
        return self.admission.busy() if self.admission is not None else None

    def ready(self) -> bool:
        return not self.draining and self.stages_ready() and self.full() is None

    def failed(self) -> list[str]:
        """Stages given up for good (they will not be restarted: an operator must act)."""
        return [name for name, s in self.stages().items() if s["state"] == "failed"]

    def status(self) -> str:
        """`ready`, `draining`, `not_ready` or `full`: the word /readyz answers with."""
        if self.draining:
            return "draining"
        if not self.stages_ready():
            return "not_ready"
        return "ready" if self.full() is None else "full"

    def summary(self) -> str:
        waiting = [
            f"{name} is {s['state']}" + (f" ({s['reason']})" if s["reason"] else "")
            for name, s in self.stages().items()
            if s["state"] != "ready"
        ]
        if self.draining:
            waiting.insert(0, DRAINING)
        full = self.full()
        if full is not None:
            waiting.append(f"full: {full}")
        return "; ".join(waiting) or "ready"
