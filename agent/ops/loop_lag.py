"""How late the API process's event loop runs: a periodic sleep, and how late it wakes up.

Every call's 20 ms audio pacing, VAD and signalling share this one loop, so a callback that
blocks it (or a CPU starved by the stage workers) shows up here first, as wake-ups that come
late. The monitor costs one timer every `interval_s`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

import numpy as np

INTERVAL_S = 0.1
WINDOW = 600  # samples kept for the recent p99: one minute at INTERVAL_S


class LoopLagMonitor:
    """Sleeps `interval_s` again and again; each wake-up's lateness is a sample."""

    def __init__(self, observe: Callable[[float], None], interval_s: float = INTERVAL_S,
                 window: int = WINDOW) -> None:
        self.observe = observe
        self.interval_s = interval_s
        self._recent: deque[float] = deque(maxlen=window)
        self._due: float | None = None  # when the pending wake-up is due (loop time)
        self.samples = 0

    async def run(self) -> None:
        """Measure until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            due = self._due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            lag = max(0.0, loop.time() - due)
            self._recent.append(lag)
            self.samples += 1
            self.observe(lag)

    def recent_max(self, window_s: float) -> float:
        """The latest wake-up's lateness over the last `window_s`, in seconds (0 before any);
        a wake-up that has not come yet counts too, as late as it already is."""
        samples = max(1, round(window_s / self.interval_s))
        overdue = 0.0
        if self._due is not None:
            overdue = max(0.0, asyncio.get_running_loop().time() - self._due)
        return max([overdue, *list(self._recent)[-samples:]])

    def p99(self) -> float:
        """The 99th percentile of the recent samples, in seconds (0 before the first)."""
        if not self._recent:
            return 0.0
        return float(np.percentile(np.fromiter(self._recent, float), 99))
