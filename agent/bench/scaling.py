"""Call workers' scaling (`omnivox bench calls --call-workers 1,2`): the same levels against a
server with each number of call workers; per server, the most calls carried on time, and the
ratio of each to the first.

A level's calls are carried at a lateness limit when none dropped, turns completed, and the
outbound pacers' lateness p99 over the level (all the call workers' together) stayed under
that limit; a server carried the most calls of such a level (0: none was). The limit that
counts is PACING_LIMIT_MS (20 ms); looser ones are reported beside it for machines where no
level keeps to 20 ms (a busy 2-core host, where callers, engines and calls share the cores).
"""

from __future__ import annotations

from typing import Any

from agent.bench.capacity import PACING_LIMIT_MS

LIMITS_MS = (PACING_LIMIT_MS, 50.0, 100.0, 200.0)


def carried(level: dict[str, Any], limit_ms: float) -> int:
    """The calls a level carried with its pacing p99 under `limit_ms`, or 0."""
    late = (level.get("capacity") or {}).get("pacing_late_p99_ms")
    on_time = late is not None and late < limit_ms
    whole = not level["calls_dropped"] and level["turns_ok"] > 0
    return int(level["calls_connected"]) if on_time and whole else 0


def scaling(runs: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per call-worker count and limit: the calls carried, and the ratio to the first count."""
    servers: list[dict[str, Any]] = []
    for workers, levels in runs.items():
        servers.append({
            "call_workers": workers,
            "carried": {f"{limit:g}": max(carried(lv, limit) for lv in levels)
                        for limit in LIMITS_MS},
            "levels": [{"concurrency": lv["concurrency"], "connected": lv["calls_connected"],
                        "dropped": lv["calls_dropped"], "turns_ok": lv["turns_ok"],
                        "pacing_late_p99_ms": (lv.get("capacity") or {}).get(
                            "pacing_late_p99_ms"),
                        "call_plane_cpu_per_call": (lv.get("capacity") or {}).get(
                            "call_plane_cpu_per_call")} for lv in levels],
        })
    first = servers[0]["carried"]
    for server in servers:
        server["ratio"] = {limit: (calls / first[limit] if first[limit] else None)
                           for limit, calls in server["carried"].items()}
    return {"pacing_limit_ms": PACING_LIMIT_MS, "servers": servers}


def scaling_table(result: dict[str, Any]) -> str:
    """The terminal table of a scaling run: calls carried (ratio to the first server) per
    pacing limit, then each level's pacing p99."""
    figures = result["scaling"]
    limits = [f"{limit:g}" for limit in LIMITS_MS]
    lines = ["call workers: calls carried (no drop, turns completed) with pacing p99 under each "
             "limit, at the same levels; (ratio to the first)",
             f"{'workers':>7} " + " ".join(f"{'< ' + lim + ' ms':>14}" for lim in limits)
             + "  pace p99 ms / srv cpu per call, by level"]
    for server in figures["servers"]:
        cells = []
        for limit in limits:
            cell = f"{server['carried'][limit]:>5} ({_fmt(server['ratio'][limit], 2)})"
            cells.append(cell.rjust(14))
        paces = ", ".join(
            f"{lv['concurrency']}: {_fmt(lv['pacing_late_p99_ms'])}"
            f" / {_fmt(lv['call_plane_cpu_per_call'], 3)}" for lv in server["levels"])
        lines.append(f"{server['call_workers']:>7} " + " ".join(cells) + f"  {paces}")
    return "\n".join(lines)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
