"""The fault tests' own server (tests/faults/conftest.py starts it) and what more than one
of their modules asks of it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.turns.orchestrator import Pipeline
from tests.rtc_client import RtcCaller
from tests.served import Served

REPLY_TOKENS = 48  # the answer after a fault: about five seconds of audio
RESTART = {"max_attempts": 2, "backoff_s": 0.2, "backoff_max_s": 1.0}


@dataclass
class FaultServer:
    served: Served
    models_dir: Path  # the server's own models dir: links to the shared tiny build, per part

    @property
    def pipeline(self) -> Pipeline:
        pipeline: Pipeline = self.served.app.state.pipeline
        return pipeline


def connected(served: Served, caller: RtcCaller) -> bool:
    """Both ends of the caller's call are up: the caller's peer and the server's."""
    call = served.app.state.calls.get(caller.call_id)
    return (caller.pc.connectionState == "connected" and call is not None
            and call.pc.connectionState == "connected")
