"""A process's scheduler figures (Linux /proc) and the verdict on a silent worker: starved or hung.

Read for a worker's main thread, the one running its event loop (the heartbeats'): its engine's
processes and its other threads have figures of their own, which say nothing of that loop.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

# A silent worker that wanted a CPU for at least this share of the window but ran for less
# than it was starved; one that ran for more had the CPU and did not beat (a loop kept busy).
_STARVED_SHARE = 0.5


@dataclass(frozen=True)
class SchedSample:
    """One reading of /proc/<pid>/schedstat and the thread's state, at `at` (monotonic s)."""

    at: float
    run_ns: int  # time on a CPU
    wait_ns: int  # time runnable on a runqueue, waiting for a CPU
    slices: int  # times it was given a CPU
    state: str  # R running or runnable, S sleeping, D uninterruptible, T stopped, ...


def sample(pid: int) -> SchedSample | None:
    """The figures of `pid`'s main thread now, or None (no such process, or no schedstat)."""
    try:
        with open(f"/proc/{pid}/schedstat") as schedstat:
            run_ns, wait_ns, slices = (int(v) for v in schedstat.read().split()[:3])
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]  # the name may hold spaces
    except (OSError, ValueError, IndexError):
        return None
    return SchedSample(time.monotonic(), run_ns, wait_ns, slices, state)


class Verdict(enum.StrEnum):
    """What a silence of a worker's event loop was."""

    STARVED = "starved"  # it wanted a CPU and mostly did not get one: slow, not hung
    HUNG = "hung"  # blocked, stopped, or on a CPU without beating


@dataclass(frozen=True)
class Silence:
    """A worker's scheduler figures over a window of silence, and what they say."""

    verdict: Verdict
    window_s: float
    ran_s: float
    waited_s: float
    slices: int
    state: str

    def __str__(self) -> str:
        return (f"over {self.window_s:.1f} s it ran {self.ran_s:.2f} s, waited for a CPU "
                f"{self.waited_s:.2f} s, got {self.slices} timeslices, state {self.state}")


def judge(before: SchedSample, after: SchedSample) -> Silence:
    """Starved or hung, from the figures at the start and at the end of a silent window.

    The kernel adds a wait to a thread's figures only when the wait ends (when it gets a CPU),
    so a thread still waiting shows too little: a thread runnable now (state R) that ran less
    than half the window is waiting, whatever was added. A stopped or blocked thread neither
    runs nor waits (hung); one that ran for most of the window had the CPU and did not beat
    (its loop is blocked by a busy callback: hung).
    """
    window = max(after.at - before.at, 1e-9)
    ran = (after.run_ns - before.run_ns) / 1e9
    waited = (after.wait_ns - before.wait_ns) / 1e9
    wanted = ran + waited >= _STARVED_SHARE * window or after.state == "R"
    starved = wanted and ran < _STARVED_SHARE * window
    return Silence(Verdict.STARVED if starved else Verdict.HUNG, window, ran, waited,
                   after.slices - before.slices, after.state)
