"""`omnivox bench calls --call-plane-cpus K`: the server's call plane on CPUs of its own.

On one machine the callers and the engines compete with the call plane (the API process and
its call workers: WebRTC, the VAD, pacing) for its CPUs, and every packet the server sends a
local caller wakes that caller, which may take the CPU from the server then and there. The
pacers' lateness then measures the machine's contention, not the call plane, and "calls per
core of the call plane at pacing p99 under 20 ms" cannot be read off it. Pinned, the API
process and its call workers run on the first K CPUs this bench may use, and everything else
(the stage workers and their engines, the bench and its callers) on the rest, as on a host
whose callers are elsewhere and whose engines have cores (or a GPU) of their own.

Threads and processes made later inherit their creator's CPUs, so the server is pinned again
before each level: an engine restarted from the API process is moved back off the plane.
"""

from __future__ import annotations

import contextlib
import os

import psutil

from agent.bench.server import CALL_WORKER


def split_cpus(plane_cpus: int) -> tuple[set[int], set[int]]:
    """(the call plane's CPUs, the others'): the first `plane_cpus` this process may use."""
    cpus = sorted(os.sched_getaffinity(0))
    if not 0 < plane_cpus < len(cpus):
        raise ValueError(f"--call-plane-cpus takes 1 to {len(cpus) - 1}, a CPU at least for "
                         f"the plane and one for the rest, of the {len(cpus)} this process may "
                         f"use ({', '.join(map(str, cpus))}), not {plane_cpus}")
    return set(cpus[:plane_cpus]), set(cpus[plane_cpus:])


def pin(process: psutil.Process, cpus: set[int]) -> None:
    """Every thread of `process` on `cpus` (a thread that ended meanwhile is skipped)."""
    with contextlib.suppress(psutil.Error):
        for thread in process.threads():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(thread.id, cpus)


def pin_server(pid: int, plane: set[int], rest: set[int]) -> None:
    """The API process `pid` and its call workers on `plane`; its other descendants (stage
    workers, engines) on `rest`."""
    api = psutil.Process(pid)
    pin(api, plane)
    for child in api.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            pin(child, plane if CALL_WORKER in child.cmdline() else rest)
