"""What one call costs, per level of `omnivox bench calls`: the call plane's CPU per call (the API
process, which holds every call's media, read from /proc by its pid), the callers' own CPU per
call, the outbound pacers' lateness (the server's /metrics), and from these the calls one core
of the call plane carries while its pacing stays on time.

CPU per call is CPU seconds per call-second: over the level, the process's CPU time divided by
the seconds its calls were live (each call from the go to the end of its last turn). Both are
read from the go on, so connecting the calls (ICE, DTLS) is not counted.
"""

from __future__ import annotations

from typing import Any

from agent.bench.server import Samples, histogram_quantile

PACING_METRIC = "omnivox_pacing_lateness_seconds"  # histogram (media/pacing.py)
PACING_LIMIT_MS = 20.0  # calls per core are counted at a pacing p99 under this


def call_plane(cpu_go: tuple[float, float, float] | None,
               cpu_end: tuple[float, float, float] | None,
               metrics_go: Samples | None, metrics_end: Samples | None,
               call_seconds: float) -> dict[str, Any]:
    """The server's side: its CPU per call and its pacers' lateness p99 over the level."""
    per_call = None
    if cpu_go is not None and cpu_end is not None and call_seconds > 0:
        per_call = (cpu_end[1] - cpu_go[1]) / call_seconds
    late = None
    if metrics_go is not None and metrics_end is not None:
        p99 = histogram_quantile(0.99, metrics_go, metrics_end, PACING_METRIC)
        late = None if p99 is None else p99 * 1e3
    on_time = late is not None and late < PACING_LIMIT_MS
    return {
        "call_seconds": call_seconds,
        "call_plane_cpu_per_call": per_call,
        "pacing_late_p99_ms": late,
        # One core's worth of this level's calls, were the pacing on time; None when it was not.
        "calls_per_core": 1 / per_call if per_call and on_time else None,
    }


def callers_cpu_per_call(workers: list[dict[str, Any]], call_seconds: float) -> float | None:
    """The load generator's CPU seconds per call-second over the level."""
    spent = [w["cpu_s"] for w in workers if w.get("cpu_s") is not None]
    return sum(spent) / call_seconds if spent and call_seconds > 0 else None


def best_calls_per_core(levels: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The level with the most calls whose pacing stayed on time, and its calls per core."""
    fit = [level for level in levels
           if (level.get("capacity") or {}).get("calls_per_core") is not None]
    if not fit:
        return None
    best = max(fit, key=lambda level: level["calls_connected"])
    return {"concurrency": best["concurrency"],
            "calls_per_core": best["capacity"]["calls_per_core"],
            "pacing_late_p99_ms": best["capacity"]["pacing_late_p99_ms"]}
