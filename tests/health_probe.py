"""Watching a served app from outside, as a load balancer would: /healthz round trips from a
process of their own, told apart from what an overloaded machine adds, and /readyz's answers
over time.

A round trip's CPU-available time is its wall time less what either end waited for a CPU
meanwhile: on a runqueue (schedstat, `tests.cpu_wait`) or, on a virtual machine, with its
virtual CPU taken by the host (the CPU's steal time in /proc/stat, which no runqueue shows).
What is left is what a blocked or busy event loop adds. The API process's garbage-collector
passes are noted too, so that a slow answer can be put down to one of them or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.served import Served

HEALTH_PROBE = r"""
import http.client, os, sys, time
host, port, interval, api_pid = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
API = f"/proc/{api_pid}/task/{api_pid}"
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")

def waited_ms(task):  # how long a thread has waited, runnable, for a CPU
    with open(f"{task}/schedstat") as stat:
        return int(stat.read().split()[1]) / 1e6

def cpu_of(task):  # the CPU a thread last ran on
    with open(f"{task}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[36])

def steal_ms():  # each CPU's steal time: its host ran something else
    with open("/proc/stat") as stat:
        return {int(f[0][3:]): int(f[8]) * TICK_MS for f in map(str.split, stat)
                if f[0].startswith("cpu") and f[0][3:].isdigit()}

conn = None
while True:
    waited, probe_waited = waited_ms(API), waited_ms("/proc/thread-self")
    stolen, cpus, began = steal_ms(), {cpu_of(API)}, time.perf_counter()
    try:
        if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/healthz")
        reply = conn.getresponse()
        reply.read()
        outcome = str(reply.status)
    except Exception as exc:
        conn, outcome = None, type(exc).__name__
    latency_ms = (time.perf_counter() - began) * 1000
    cpus.add(cpu_of(API))
    now = steal_ms()
    api_stolen = max(now[cpu] - stolen[cpu] for cpu in cpus)
    print(f"{time.monotonic():.4f} {latency_ms:.3f} {outcome} {waited_ms(API) - waited:.3f} "
          f"{waited_ms('/proc/thread-self') - probe_waited:.3f} {api_stolen:.1f}", flush=True)
    time.sleep(interval)
"""


@dataclass
class Sample:
    at: float  # monotonic time the request was sent
    ms: float  # its round trip (inf: it failed)
    api_waited_ms: float  # meanwhile, how long the API's thread was runnable but not running
    probe_waited_ms: float  # and the probe's own thread (it times the round trip)
    stolen_ms: float  # and the steal time of the CPUs the API's thread ran on (10 ms ticks)

    @property
    def cpu_available_ms(self) -> float:
        """The round trip less the time either end of it waited for a CPU: what a blocked or
        busy event loop in the API process adds, and an overloaded machine does not."""
        return self.ms - self.api_waited_ms - self.probe_waited_ms - self.stolen_ms

    @property
    def until(self) -> float:
        return self.at + self.ms / 1000


@dataclass
class GcPause:
    at: float  # monotonic start
    ms: float
    generation: int


@dataclass
class HealthProbe:
    """GET /healthz every 20 ms from a process of its own over one kept-alive connection: each
    sample is the request's own round trip, with the CPU waits and steal of its two ends, while
    the garbage collector's passes in this (the API's) process are timed."""

    served: Served
    samples: list[Sample] = field(default_factory=list)
    gc_pauses: list[GcPause] = field(default_factory=list)
    _gc_began: float = 0.0

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[HealthProbe]:
        host, port = self.served.url.removeprefix("http://").split(":")
        api_pid = os.getpid()  # the served app runs in this process
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", HEALTH_PROBE, host, port, "0.02", str(api_pid),
            stdout=asyncio.subprocess.PIPE)
        reader = asyncio.create_task(self._read(process.stdout))
        gc.callbacks.append(self._on_gc)
        try:
            yield self
        finally:
            gc.callbacks.remove(self._on_gc)
            process.kill()
            await process.wait()
            await reader

    async def _read(self, stream: asyncio.StreamReader | None) -> None:
        assert stream is not None  # stdout is a pipe
        async for line in stream:
            ended, ms, outcome, waited, probe_waited, stolen = line.decode().split()
            latency = float(ms) if outcome == "200" else float("inf")
            self.samples.append(Sample(float(ended) - float(ms) / 1000, latency, float(waited),
                                       float(probe_waited), float(stolen)))

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        now = time.monotonic()
        if phase == "start":
            self._gc_began = now
        else:
            self.gc_pauses.append(GcPause(self._gc_began, (now - self._gc_began) * 1000,
                                          info["generation"]))

    def between(self, since: float, until: float) -> list[Sample]:
        return [s for s in self.samples if since <= s.at <= until]

    def explain(self, sample: Sample) -> str:
        """A sample's figures: its round trip and what of it the machine took, and the
        garbage-collector passes in the API process during it."""
        pauses = [p for p in self.gc_pauses
                  if p.at < sample.until and p.at + p.ms / 1000 > sample.at]
        collected = ", ".join(f"gen{p.generation} {p.ms:.1f} ms" for p in pauses) or "none"
        return (f"{sample.ms:.1f} ms, of which the API thread waited {sample.api_waited_ms:.1f} ms "
                f"for a CPU, the probe {sample.probe_waited_ms:.1f} ms, and the host took "
                f"{sample.stolen_ms:.0f} ms of the API's CPU; garbage-collector passes during "
                f"it: {collected}")


@dataclass
class ReadyzWatch:
    """Polls /readyz every 50 ms and keeps what it answered."""

    served: Served
    seen: list[tuple[float, int, dict[str, Any]]] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ReadyzWatch]:
        task = asyncio.create_task(self._poll())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _poll(self) -> None:
        async with httpx.AsyncClient(base_url=self.served.url, timeout=10) as http:
            while True:
                reply = await http.get("/readyz")
                self.seen.append((time.monotonic(), reply.status_code, reply.json()))
                await asyncio.sleep(0.05)

    def after(self, since: float) -> list[tuple[float, int, dict[str, Any]]]:
        return [entry for entry in self.seen if entry[0] >= since]

    def ready_again_after(self, since: float) -> float | None:
        """When /readyz first said 200 after saying 503 (since `since`), if it has."""
        down = False
        for at, status, _ in self.after(since):
            down = down or status == 503
            if down and status == 200:
                return at
        return None


def percentile(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]
