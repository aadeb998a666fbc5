"""Time a thread spent waiting for a CPU, from Linux's /proc/<pid>/task/<tid>/schedstat (its
second field: nanoseconds runnable on a runqueue, not running).

A test that promises "within a second" checks a second of CPU-available time: the wall time
less what the processes doing the work waited, runnable, for a CPU meanwhile. A busy machine
then cannot fail it, while a process that sleeps, blocks or computes too long still does (a
blocked or busy thread does not wait on a runqueue). Where there is no schedstat nothing is
discounted.
"""

from __future__ import annotations

import os
import time


def waited_s(pid: int, tid: int | None = None) -> float | None:
    """How long thread `tid` of `pid` (its main thread by default) has waited for a CPU in all,
    or None (no such thread, or no schedstat)."""
    try:
        with open(f"/proc/{pid}/task/{tid or pid}/schedstat") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class CpuWait:
    """The CPU waits of some processes' main threads since this was made: `waited()` is their
    sum (a process that has exited counts up to its last reading)."""

    def __init__(self, *pids: int) -> None:
        self.pids = pids or (os.getpid(),)
        self.began = time.monotonic()
        self._first = {pid: waited_s(pid) for pid in self.pids}
        self._last = dict(self._first)

    def waited(self) -> float:
        total = 0.0
        for pid in self.pids:
            now = waited_s(pid)
            if now is not None:
                self._last[pid] = now
            first, last = self._first[pid], self._last[pid]
            if first is not None and last is not None:
                total += max(0.0, last - first)
        return total

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def available(self) -> float:
        """Seconds since this was made less the waits: the time those threads could run."""
        return self.elapsed() - self.waited()

    def __str__(self) -> str:
        return (f"{self.elapsed():.2f} s, of which {self.waited():.2f} s waiting for a CPU "
                f"(threads of pids {', '.join(map(str, self.pids))})")
