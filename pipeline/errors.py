"""The typed errors the pipeline reports to its callers (as `TurnFailed.error` or raised)."""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every error the pipeline reports."""


class StageError(PipelineError):
    """Something went wrong in one stage; `reason` says what, in words an operator can act on."""

    def __init__(self, stage: str, reason: str) -> None:
        super().__init__(f"stage {stage}: {reason}")
        self.stage = stage
        self.reason = reason


class StageFailedError(StageError):
    """The stage's worker died, hung or is not running: its in-flight requests are lost."""


class StageStalledError(StageError):
    """A request of the stage produced no output for the pipeline's `stall_timeout_s` (its
    engine is stuck, or hopelessly behind): it was aborted, the worker left running."""


class RequestFailedError(StageError):
    """The stage's worker is alive but this one request failed inside it."""


class PipelineBusyError(PipelineError):
    """A bound was reached (turns in flight, a request's output queue): the work was refused."""


class PipelineNotRunningError(PipelineError):
    """The pipeline was used before `start()` or after `stop()`."""
