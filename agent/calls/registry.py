"""The calls this process holds, bounded by the configured maximum."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from agent.calls.call import Call
from agent.calls.call_base import CallBase
from agent.config import Settings
from agent.ops.metrics import Metrics
from agent.ops.readiness import FailureSource
from agent.ops.records import CallRecords
from agent.realtime.server_events import stage_failed_event


class CallLimitError(RuntimeError):
    """No room for another call."""


class CallRegistry:
    """Live calls by id; a call removes itself when it ends."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics | None = None,
        records: CallRecords | None = None,
    ) -> None:
        self.settings = settings
        self.records = records
        self.metrics = metrics if metrics is not None else Metrics()
        self._calls: dict[str, CallBase] = {}

    def new_call(self, kind: type[CallBase] = Call) -> Any:
        """A new call of `kind` (WebRTC unless told), counted against the maximum."""
        if len(self._calls) >= self.settings.max_calls:
            raise CallLimitError(f"the server holds its maximum of {self.settings.max_calls} calls")
        call = kind(
            self.settings, on_ended=self._forget, metrics=self.metrics, records=self.records
        )
        self._calls[call.id] = call
        return call

    def get(self, call_id: str) -> Any:
        return self._calls.get(call_id)

    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self) -> Iterator[CallBase]:
        """The live calls (a snapshot: a call may end while the caller iterates)."""
        return iter(list(self._calls.values()))

    def _forget(self, call: CallBase) -> None:
        self._calls.pop(call.id, None)

    async def close_all(self) -> None:
        await asyncio.gather(*(c.close("server_shutdown") for c in list(self._calls.values())))


def announce_stage_failures(pipeline: FailureSource, calls: CallRegistry) -> None:
    """Tell every live call, with an `error` event, when a stage is marked failed: its caller
    learns at once, not only when its next reply fails."""

    def announce(stage: str, reason: str) -> None:
        for call in calls:
            call.send_event(stage_failed_event(stage, reason))

    pipeline.on_stage_failed(announce)
