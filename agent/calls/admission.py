"""Admission control: whether the call plane can carry one more call, judged from its measured
load (the event loop's recent lateness, the outbound pacers' frame lateness, and the share of time
the loop's thread waited for a CPU).

Every call's 20 ms pacing, VAD and signalling run on the API process's one event loop. Past
the load where that loop wakes late, pacing collapses for every call at once (PLATFORM.md:
aiortc falls off a cliff near 88% of a core), so a new call is refused with 503 before that
point, at once, and the calls already admitted keep their CPU.

The figures show a call's load only once it runs, seconds after its offer was taken: offers
arriving together would all be taken on the figures of before. So at most `max_starting` calls
are taken per window; the next waits (503, Retry-After) until the figures include them.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from dataclasses import dataclass

from agent.ops.loop_lag import LoopLagMonitor
from media.pacing import PacingLateness, pacing_lateness
from pipeline.runtime import schedstat

SAMPLE_S = 0.5  # how often the loop thread's scheduler figures are read
PACING_QUANTILE = 0.99  # of the frames paced in the window


@dataclass(frozen=True)
class AdmissionLimits:
    """Above any figure over the last `window_s`, new calls are refused (0: that check off)."""

    max_loop_lag_s: float
    max_cpu_wait: float  # share of wall time the loop's thread was runnable but not running
    window_s: float
    max_pacing_late_s: float = 0.0  # p99 of the calls' outbound frames against their clock
    max_starting: int = 0  # calls taken within the window, whose load the figures lack yet


class Admission:
    """Measures the call plane's load and says, for each offer, whether it fits."""

    def __init__(self, limits: AdmissionLimits, loop_lag: LoopLagMonitor,
                 pacing: PacingLateness = pacing_lateness) -> None:
        self.limits = limits
        self.loop_lag = loop_lag
        self.pacing = pacing
        self._pid = os.getpid()
        keep = max(2, int(limits.window_s / SAMPLE_S) + 1)
        self._waits: deque[tuple[float, int]] = deque(maxlen=keep)
        self._taken: deque[float] = deque()  # when each call of the window was taken

    async def run(self) -> None:
        """Sample the loop thread's CPU wait until cancelled."""
        while True:
            # No figures (another kernel): the CPU check is skipped.
            if (now := schedstat.sample(self._pid)) is not None:
                self._waits.append((now.at, now.wait_ns))
            await asyncio.sleep(SAMPLE_S)

    def cpu_wait(self) -> float:
        """Share of the recent window the loop's thread waited for a CPU (0 when unknown)."""
        if len(self._waits) < 2:
            return 0.0
        (t0, w0), (t1, w1) = self._waits[0], self._waits[-1]
        return (w1 - w0) / 1e9 / (t1 - t0) if t1 > t0 else 0.0

    def recent_lag(self) -> float:
        """The event loop's worst lateness over the window, in seconds."""
        return self.loop_lag.recent_max(self.limits.window_s)

    def pacing_late(self) -> float:
        """The p99 of the calls' frame lateness over the window, in seconds (0: no frames)."""
        return self.pacing.recent_quantile(PACING_QUANTILE, self.limits.window_s)

    def taken(self) -> None:
        """A call was taken now (its offer answered, its WebSocket accepted)."""
        self._taken.append(time.monotonic())

    def starting(self) -> int:
        """Calls taken within the window: their load is not all in the figures yet."""
        since = time.monotonic() - self.limits.window_s
        while self._taken and self._taken[0] < since:
            self._taken.popleft()
        return len(self._taken)

    def busy(self) -> str | None:
        """Why one more call would not be carried now, or None when it fits."""
        limits = self.limits
        starting = self.starting()
        if limits.max_starting and starting >= limits.max_starting:
            return (f"{starting} calls taken in the last {limits.window_s:g} s are not in the "
                    f"load figures yet (limit {limits.max_starting})")
        lag = self.recent_lag()
        if limits.max_loop_lag_s and lag > limits.max_loop_lag_s:
            return (f"the event loop ran {lag * 1e3:.0f} ms late in the last "
                    f"{limits.window_s:g} s (limit {limits.max_loop_lag_s * 1e3:.0f} ms)")
        late = self.pacing_late()
        if limits.max_pacing_late_s and late > limits.max_pacing_late_s:
            return (f"the calls' audio frames left up to {late * 1e3:.0f} ms late (p99) in the "
                    f"last {limits.window_s:g} s (limit {limits.max_pacing_late_s * 1e3:.0f} ms)")
        wait = self.cpu_wait()
        if limits.max_cpu_wait and wait > limits.max_cpu_wait:
            return (f"the call plane waited for a CPU {wait:.0%} of the last "
                    f"{limits.window_s:g} s (limit {limits.max_cpu_wait:.0%})")
        return None
