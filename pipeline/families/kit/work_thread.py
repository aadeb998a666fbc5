"""A stage's work thread: where its blocking work (a model's forward) runs, off the event loop.

One thread: the machines have few cores and each model runs single-threaded; a stage's calls
run one after another in submission order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class WorkThread:
    """One thread for a stage's blocking work, so the event loop never runs it."""

    def __init__(self, name: str, kind: str = "work") -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-{kind}")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` in the thread and await its result."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        """Stop taking work; queued calls are cancelled."""
        self._executor.shutdown(wait=False, cancel_futures=True)
