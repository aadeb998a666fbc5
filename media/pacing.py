"""How late the outbound pacers release their frames: every call's 20 ms frames, one process-wide
record (all calls of a process share its event loop, so they are late together).

A frame is late by how long after its due time (start + n * 20 ms) it was handed to the sender.
The record keeps cumulative bucket counts (the /metrics histogram) and the same counts per
`SLOT_S` slot for the last `KEEP_S` seconds, so a recent percentile (admission control) costs a
sum over a few slots, and observing a frame costs one bisect.
"""

from __future__ import annotations

import bisect
import time
from collections import deque

# Upper bounds of the buckets, in seconds (the last, +inf, is implicit).
BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
SLOT_S = 0.5
KEEP_S = 60.0


class PacingLateness:
    """Bucket counts of frame lateness: in total, and per recent slot."""

    def __init__(self, bounds: tuple[float, ...] = BUCKETS_S, slot_s: float = SLOT_S,
                 keep_s: float = KEEP_S) -> None:
        self.bounds = bounds
        self.slot_s = slot_s
        self.counts = [0] * (len(bounds) + 1)  # cumulative since start, per bucket (not le)
        self.total_s = 0.0
        self._slots: deque[tuple[int, list[int]]] = deque(maxlen=max(1, int(keep_s / slot_s)))

    def observe(self, late_s: float, now: float | None = None) -> None:
        """One frame released `late_s` after its due time."""
        late_s = max(0.0, late_s)
        index = bisect.bisect_left(self.bounds, late_s)
        self.counts[index] += 1
        self.total_s += late_s
        slot = int((time.monotonic() if now is None else now) / self.slot_s)
        if not self._slots or self._slots[-1][0] != slot:
            self._slots.append((slot, [0] * len(self.counts)))
        self._slots[-1][1][index] += 1

    def recent(self, window_s: float, now: float | None = None) -> list[int]:
        """Bucket counts of the frames released in the last `window_s` (whole slots)."""
        first = int(((time.monotonic() if now is None else now) - window_s) / self.slot_s)
        out = [0] * len(self.counts)
        for slot, counts in reversed(self._slots):
            if slot < first:
                break
            out = [a + b for a, b in zip(out, counts, strict=True)]
        return out

    def recent_quantile(self, q: float, window_s: float, now: float | None = None) -> float:
        """The q-quantile of the lateness over the last `window_s` (s; 0 with no frames): the
        upper bound of the bucket it falls in (the last finite bound past them)."""
        counts = self.recent(window_s, now)
        total = sum(counts)
        if not total:
            return 0.0
        rank, seen = q * total, 0
        for bound, count in zip((*self.bounds, self.bounds[-1]), counts, strict=True):
            seen += count
            if seen >= rank:
                return bound
        return self.bounds[-1]


pacing_lateness = PacingLateness()  # the process's pacers report here
