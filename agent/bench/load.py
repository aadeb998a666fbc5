"""The load generator of `omnivox bench calls`: one level's callers spread over spawned worker
processes (each one asyncio loop with its share of the calls), started together on a go."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import queue as queue_module
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from agent.bench.call_script import connect_call, run_call
from agent.bench.capacity import call_plane
from agent.bench.level import LevelRun, Plan
from agent.bench.server import ServerWatch, server_figures
from agent.bench.speech import read_wav

CONNECTS_AT_ONCE = 4  # per worker process: offers in flight together (ICE and DTLS cost CPU)
HANG_UP_S = 60.0  # after the last call's record: workers still hanging up are then ended


def worker_main(plan: Plan, indices: list[int], out: Any, go: Any, start: Any) -> None:
    """A worker process: connect its callers, wait for the go, run their calls."""
    asyncio.run(_worker(plan, indices, out, go, start))


async def _orphan_watch(parent: int) -> None:
    """End this worker if the process that started it is gone (killed without cleaning up)."""
    while os.getppid() == parent:
        await asyncio.sleep(2.0)
    os._exit(1)


async def _worker(plan: Plan, indices: list[int], out: Any, go: Any, start: Any) -> None:
    from agent.ops.loop_lag import LoopLagMonitor

    # A starved generator re-anchors its microphones' clocks: that shows in the loop lag it
    # reports, not as a warning per call on the terminal under the progress bar.
    logging.getLogger("media.outbound").setLevel(logging.ERROR)
    speech = [read_wav(path)[0] for path in plan.speech]
    lags: list[float] = []
    monitor = asyncio.ensure_future(LoopLagMonitor(lags.append).run())
    orphan = asyncio.ensure_future(_orphan_watch(os.getppid()))
    gate = asyncio.Semaphore(CONNECTS_AT_ONCE)
    connected = await asyncio.gather(*(connect_call(i, plan, gate) for i in indices))
    for _, info in connected:
        out.put(("connected", info))
    callers = [(info["call"], c) for c, info in connected if c is not None]
    cpu_began = began = None
    try:
        await asyncio.to_thread(go.wait)
        lags.clear()
        cpu_began, began = time.process_time(), time.monotonic()
        results = await asyncio.gather(*(run_call(i, c, plan, speech, start.value, out.put)
                                         for i, c in callers), return_exceptions=True)
        for (i, caller), result in zip(callers, results, strict=True):
            if isinstance(result, BaseException):  # a bug in the script, not a call's fault
                result = {"call": i, "connected": True, "dropped": caller.dropped,
                          "error_events": caller.counts["error"], "errors": [],
                          "turns_ok": 0, "turns_failed": 0,
                          "crashed": f"{type(result).__name__}: {result}"}
            out.put(("call", result))
    finally:
        monitor.cancel()
        orphan.cancel()
        await asyncio.gather(*(c.hang_up() for _, c in callers), return_exceptions=True)
        p99 = float(np.percentile(lags, 99)) * 1e3 if lags else None
        spent = None if cpu_began is None else time.process_time() - cpu_began
        cores = (None if began is None or spent is None else
                 spent / max(1e-9, time.monotonic() - began))
        out.put(("worker", {"pid": os.getpid(), "loop_lag_p99_ms": p99, "cpu_cores": cores,
                            "cpu_s": spent}))


def run_level(plan: Plan, workers: int, watch: ServerWatch | None = None,
              progress: bool = True, on_start: Callable[[float], None] | None = None
              ) -> LevelRun:
    """Run one level: callers in `workers` spawned processes; a progress bar over turns."""
    from tqdm import tqdm

    workers = max(1, min(workers, plan.concurrency))
    began = time.monotonic()
    context = multiprocessing.get_context("spawn")
    out, go, start = context.Queue(), context.Event(), context.Value("d", 0.0)
    shares = [list(range(w, plan.concurrency, workers)) for w in range(workers)]
    processes = [context.Process(target=worker_main, args=(plan, share, out, go, start),
                                 name=f"omnivox-bench-callers-{n}", daemon=True)
                 for n, share in enumerate(shares)]
    for process in processes:
        process.start()
    before = watch.snapshot() if watch is not None else None
    cpu_before = watch.cpu() if watch is not None else None
    calls: dict[int, dict[str, Any]] = {}
    turns: list[dict[str, Any]] = []
    finished: list[dict[str, Any]] = []
    total = plan.concurrency * plan.turns if plan.turns is not None else None
    bar = tqdm(total=total, unit="turn", desc=f"{plan.concurrency} calls", disable=not progress,
               dynamic_ncols=True)
    connect_deadline = time.monotonic() + plan.connect_timeout_s * (
        1 + plan.concurrency / (CONNECTS_AT_ONCE * workers))
    started_at = None
    at_go: tuple[Any, Any] = (None, None)  # the server's CPU and /metrics at the go
    all_reported: float | None = None  # when the last call's record arrived
    try:
        while len(finished) < workers:
            if all_reported is None and started_at is not None and sum(
                    "turns_ok" in c or not c.get("connected") for c in calls.values()
            ) == plan.concurrency:
                all_reported = time.monotonic()
            if all_reported is not None and time.monotonic() - all_reported > HANG_UP_S:
                break  # the calls are done; a worker stuck hanging up is not waited for
            if started_at is None and (len(calls) == plan.concurrency
                                       or time.monotonic() > connect_deadline):
                start.value = started_at = time.monotonic()
                if on_start is not None:
                    on_start(started_at)
                go.set()
                if watch is not None:
                    at_go = (watch.cpu(), watch.snapshot())
                bar.set_postfix_str(f"{sum(c['connected'] for c in calls.values())} connected")
            try:
                kind, item = out.get(timeout=0.5)
            except queue_module.Empty:
                if all(not p.is_alive() for p in processes):
                    break  # every worker is gone (a crash): nothing more will come
                continue
            if kind == "connected" or kind == "call":
                calls[item["call"]] = {**calls.get(item["call"], {}), **item}
            elif kind == "turn":
                turns.append(item)
                bar.update(1)
                failed = sum(not t["ok"] for t in turns)
                if failed:
                    bar.set_postfix_str(f"{failed} failed")
            elif kind == "stamps":  # the server's stamps of a call's turns, at its end
                stamps = {s.pop("turn"): s for s in item["turns"]}
                for t in turns:
                    if t["call"] == item["call"] and t["turn"] in stamps:
                        t["stamps"] = stamps[t["turn"]]
            elif kind == "worker":
                finished.append(item)
    finally:
        bar.close()
        go.set()
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    ended_at = time.monotonic()
    run = LevelRun(plan, [calls[i] for i in sorted(calls)], turns, finished, began,
                   started_at or ended_at, ended_at)
    if watch is not None:
        after, cpu_after = watch.snapshot(), watch.cpu()
        run.server = server_figures(watch, run.started_at, ended_at, before, after,
                                    cpu_before, cpu_after)
        call_seconds = sum(c.get("call_s") or 0.0 for c in calls.values())
        run.server["capacity"] = call_plane(at_go[0], cpu_after, at_go[1], after, call_seconds)
    return run
