"""The calls this process holds, bounded by the configured maximum."""

from __future__ import annotations

import asyncio

from agent.call import Call
from agent.config import Settings


class CallLimitError(RuntimeError):
    """No room for another call."""


class CallRegistry:
    """Live calls by id; a call removes itself when it ends."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._calls: dict[str, Call] = {}

    def new_call(self) -> Call:
        if len(self._calls) >= self.settings.max_calls:
            raise CallLimitError(f"the server holds its maximum of {self.settings.max_calls} calls")
        call = Call(self.settings, on_ended=self._forget)
        self._calls[call.id] = call
        return call

    def get(self, call_id: str) -> Call | None:
        return self._calls.get(call_id)

    def __len__(self) -> int:
        return len(self._calls)

    def _forget(self, call: Call) -> None:
        self._calls.pop(call.id, None)

    async def close_all(self) -> None:
        await asyncio.gather(*(c.close() for c in list(self._calls.values())))
