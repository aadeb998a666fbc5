"""One HTTP request's model work: its stream of outputs, its slot, and its client.

A run holds a slot of the engine it uses (completion_slots.py) and gives it back exactly once,
closing its stream (which aborts the engine requests still running) however the request ends:
answered, streamed to the end, failed, or left by its client. Starlette does not cancel a
handler whose client left, so waits that could outlast the client go through `unless_gone`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import suppress
from typing import Generic, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from agent.api.completion_slots import CompletionSlots

T = TypeVar("T")
CLIENT_GONE = 499  # the status nginx logs for a client that closed before the answer


class ModelRun(Generic[T]):
    """A request's stream of outputs and its slot of `engine`, given back exactly once."""

    def __init__(self, outputs: AsyncIterator[T], slots: CompletionSlots, engine: str) -> None:
        self.outputs, self.slots, self.engine = outputs, slots, engine
        self._closed = False

    async def next(self) -> T:
        return await anext(self.outputs)

    async def close(self) -> None:
        """Abort the engine requests if they are still running; free the slot."""
        if self._closed:
            return
        self._closed = True
        try:
            aclose = getattr(self.outputs, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            self.slots.give_back(self.engine)


class RunStream(StreamingResponse):
    """A streamed answer; its run is closed however the response ends, even if its body was
    never iterated (the client left before the first byte)."""

    def __init__(self, body: AsyncIterator[bytes], run: ModelRun, media_type: str) -> None:
        super().__init__(body, media_type=media_type, headers={"Cache-Control": "no-cache"})
        self.run = run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.run.close()


async def unless_gone(request: Request, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None as soon as the client has closed its connection (`work` is
    cancelled then; closing the run aborts the engine request): a request nobody waits for
    must not keep its slot."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait([task, gone], return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler is cancelled: the work never outlives it
        gone.cancel()
        if not task.done():
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
    return None if task.cancelled() else task.result()


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (the body is read: only a disconnect comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
