"""The calls this process holds, bounded by the configured maximum."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from agent.calls.call import Call
from agent.calls.call_base import CallBase
from agent.calls.readiness import FailureSource
from agent.calls.resume import ResumeStore
from agent.config import Settings
from agent.ops.metrics import Metrics
from agent.ops.records import CallRecords
from agent.realtime.server_events import stage_failed_event
from agent.realtime.session_config import SavedConversation


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
        # Dropped calls' conversations, at most as many as the calls the server holds.
        self.resumes = ResumeStore(settings.resume_grace_s, settings.max_calls)

    def new_call(self, kind: type[CallBase] = Call) -> Any:
        """A new call of `kind` (WebRTC unless told), counted against the maximum; a WebRTC
        call gets a resume token when resuming is on."""
        if len(self._calls) >= self.settings.max_calls:
            raise CallLimitError(f"the server holds its maximum of {self.settings.max_calls} calls")
        call = kind(
            self.settings, on_ended=self._forget, metrics=self.metrics, records=self.records
        )
        if kind is Call:
            call.resume_token = self.resumes.issue(call.id)
        self._calls[call.id] = call
        return call

    async def take_over(self, token: str) -> SavedConversation:
        """The conversation a caller resumes with `token`: a live call of that token is closed
        first (its caller is back before the server saw the drop); ResumeError if none."""
        live = self._calls.get(self.resumes.live_call(token) or "")
        if live is not None:
            await live.close("resumed")
        return self.resumes.take(token)

    def get(self, call_id: str) -> Any:
        return self._calls.get(call_id)

    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self) -> Iterator[CallBase]:
        """The live calls (a snapshot: a call may end while the caller iterates)."""
        return iter(list(self._calls.values()))

    def _forget(self, call: CallBase) -> None:
        self._calls.pop(call.id, None)
        if call.resume_token is not None:
            save = getattr(call.handler, "save", None)
            self.resumes.ended(call.resume_token, call.end_reason or "",
                               save() if save is not None else None)

    async def close_all(self) -> None:
        await asyncio.gather(*(c.close("server_shutdown") for c in list(self._calls.values())))


def announce_stage_failures(pipeline: FailureSource, calls: CallRegistry) -> None:
    """Tell every live call, with an `error` event, when a stage is marked failed: its caller
    learns at once, not only when its next reply fails."""

    pipeline.on_stage_failed(lambda stage, reason: tell_stage_failed(calls, stage, reason))


def tell_stage_failed(calls: CallRegistry, stage: str, reason: str) -> None:
    """Every live call gets an `error` event: `stage` was given up for good, for `reason`."""
    for call in calls:
        call.send_event(stage_failed_event(stage, reason))
