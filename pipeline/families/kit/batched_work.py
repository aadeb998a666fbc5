"""Work items of concurrent requests run in batches in a stage's work thread, as they queue up.

A request puts its item in and awaits its result. The items queued while the thread is busy
run together as one call of the batch function when it frees: many concurrent calls pay for
one pass (a GPU reads the weights once), and a lone call waits for nothing (no gathering
window). The batch function takes a list of items and returns their results in order; when it
raises, every request of that batch fails with the error.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pipeline.families.kit.work_thread import WorkThread

In = TypeVar("In")
Out = TypeVar("Out")


@dataclass(eq=False)
class _Queued(Generic[In, Out]):
    item: In
    result: asyncio.Future[Out] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class BatchedWork(Generic[In, Out]):
    """One batch function, fed the items queued for it, `max_batch` at most a call."""

    def __init__(self, thread: WorkThread, batch: Callable[[list[In]], list[Out]],
                 max_batch: int) -> None:
        self.thread = thread
        self.batch = batch
        self.max_batch = max_batch
        self.queued: list[_Queued[In, Out]] = []
        self.running: asyncio.Task[None] | None = None
        self.sizes: deque[int] = deque(maxlen=1000)  # the sizes of the last batches run

    async def run(self, item: In) -> Out:
        """The item's result, computed in a batch with whatever else is queued."""
        queued: _Queued[In, Out] = _Queued(item)
        self.queued.append(queued)
        if self.running is None or self.running.done():
            self.running = asyncio.ensure_future(self._drain())
        return await queued.result

    async def _drain(self) -> None:
        """Run the queued items in batches until none are left."""
        while self.queued:
            batch, self.queued = self.queued[:self.max_batch], self.queued[self.max_batch:]
            self.sizes.append(len(batch))
            try:
                results = await self.thread.run(self.batch, [q.item for q in batch])
            except Exception as exc:  # each waiting request fails with it
                for q in batch:
                    if not q.result.done():
                        q.result.set_exception(exc)
                continue
            for q, result in zip(batch, results, strict=True):
                if not q.result.done():  # a request whose stream closed meanwhile wants none
                    q.result.set_result(result)
