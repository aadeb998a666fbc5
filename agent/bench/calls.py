"""`omnivox bench calls`: time to first audio, barge-in and capacity, measured the way callers feel
them, over many concurrent WebRTC calls.

A load generator: `concurrency` simulated callers (aiortc peers, `BenchCaller`) spread over
worker processes (spawned; each runs one asyncio loop with its share of the callers), so the
generator is not what runs out of CPU first. Each caller speaks utterances made once with
espeak-ng (cached as 16 kHz WAVs, trimmed to their audible part), waits for the reply, pauses,
and speaks again; every `barge_in_every`-th reply is talked over by the next utterance once
`barge_in_after_s` of it has been heard. Per turn, at the caller:

- time to first audio: from the end of the caller's speech to the first loud sample of the
  reply (both on the media timeline, see agent/bench/caller.py). It includes the server's
  end-of-turn silence (turn_detection.silence_duration_ms, 500 ms by default), which is also
  reported subtracted (`ttfa_after_vad_ms`: what the server took once it could know the turn
  had ended);
- barge-in stop: from the onset of the caller's interrupting speech to the end of the last
  reply sample heard (the server needs `barge_in_min_ms` of speech before it cuts);
- continuity: silences inside a reply in the stream's media time (underruns), and the longest
  late arrival against the stream's pace;
- success: the reply started, completed (or was cancelled by the barge-in) and played out, with
  no `error` event, no timeout and no dropped connection.

Levels of concurrency run one after the other on the same server; `--compare-sequential` also
runs the first level on a server whose stages run one after the other (no overlap).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import queue as queue_module
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from agent.bench.caller import BenchCaller, CallDroppedError, Utterance
from agent.bench.calls_report import TARGETS, report, summarise
from agent.bench.level import LevelRun, Plan
from agent.bench.server import ServerProcess, ServerWatch, server_figures, wait_calls_ended
from agent.bench.speech import MIC_RATE, default_speech_dir, read_wav, utterance_wavs
from agent.bench.turn import QUESTIONS

SAMPLE_RATE = MIC_RATE  # the callers' microphones run at 16 kHz
GAP_MS = 100  # a silence this long inside a reply counts as a gap
BARGE_IN_TIMEOUT_S = 10.0  # the server must cut a talked-over reply within this
IN_FLIGHT_S = 0.2  # reply audio already on the wire when the cut was announced
QUIET_S = 1.5  # after a failed turn: silence heard this long before the next utterance
CONNECTS_AT_ONCE = 4  # per worker process: offers in flight together (ICE and DTLS cost CPU)
HANG_UP_S = 60.0  # after the last call's record: workers still hanging up are then ended


# -- one call --------------------------------------------------------------------------------

class TurnFailedError(Exception):
    """The turn did not do what a caller expects; the message says what (a short reason)."""


@dataclass
class TurnRecord:
    call: int
    turn: int
    barge_in: bool  # the reply was to be talked over
    ok: bool = False
    reason: str | None = None
    ttfa_ms: float | None = None
    barge_in_stop_ms: float | None = None
    barge_in_heard_ms: float | None = None  # our onset -> the server's speech_started arrived
    gaps_ms: float | None = None  # longest silence inside the reply
    gaps: int = 0  # silences of GAP_MS or more inside the reply
    late_ms: float | None = None  # longest late arrival against the stream's pace
    status: str | None = None  # the reply's response.done status
    started_at: float = 0.0
    ended_at: float = 0.0


async def speak_turn(caller: BenchCaller, plan: Plan, record: TurnRecord, pcm: np.ndarray,
                     said: Utterance | None, interrupt_with: np.ndarray | None
                     ) -> Utterance | None:
    """One turn: speak `pcm` (or take `said`, an utterance already spoken over the previous
    reply), time the reply's first audio, then either let it play out or talk over it with
    `interrupt_with` and time the cut. Returns the interrupting utterance (the next turn's)."""
    timeout = plan.turn_timeout_s
    utterance = said or await caller.say(pcm, SAMPLE_RATE)
    onset = await caller.wait_until(lambda: utterance.onset, timeout, "the utterance's onset")
    end = await caller.wait_until(lambda: utterance.end, timeout, "the utterance's end")
    created_at, response_id = await caller.wait_until(
        lambda: caller.response_created_after(onset), timeout, "response.created")

    def event(kind: str) -> tuple[float, dict[str, Any]] | None:
        return caller.response_event(response_id, kind)

    def done() -> tuple[float, dict[str, Any]] | None:
        return event("response.done")

    def no_audio() -> str | None:
        """Why no audio will come: the reply failed, or it played out (a short reply may be
        done generating before its first packet arrives: that is no failure)."""
        finished = done()
        if finished is not None and finished[1]["response"]["status"] != "completed":
            return f"response {finished[1]['response']['status']} before any audio"
        if event("output_audio_buffer.stopped") is not None:
            return "the reply played out without any audio heard"
        return None

    after = max(end, created_at)
    first = await caller.wait_until(lambda: caller.first_loud_after(after) or no_audio(),
                                    timeout, "the reply's first audio")
    if isinstance(first, str):
        raise TurnFailedError(first)
    record.ttfa_ms = (first - end) * 1e3

    if interrupt_with is not None:
        await asyncio.sleep(max(0.0, first + plan.barge_in_after_s - time.monotonic()))
        if event("output_audio_buffer.stopped") is None:
            return await barge_in(caller, plan, record, response_id, first, interrupt_with)
        record.reason = "reply ended before the barge-in"  # noted; the turn goes on as usual
    finished = await caller.wait_until(done, timeout, "response.done")
    record.status = finished[1]["response"]["status"]
    if record.status != "completed":
        raise TurnFailedError(f"response {record.status}")
    stopped_at, _ = await caller.wait_until(lambda: event("output_audio_buffer.stopped"),
                                            timeout, "output_audio_buffer.stopped")
    note_continuity(caller, record, first, stopped_at)
    return None


async def barge_in(caller: BenchCaller, plan: Plan, record: TurnRecord, response_id: str,
                   first: float, pcm: np.ndarray) -> Utterance | None:
    """Talk over the reply now; time from our onset to the last reply sample heard."""
    utterance = await caller.say(pcm, SAMPLE_RATE)
    onset = await caller.wait_until(lambda: utterance.onset, plan.turn_timeout_s,
                                    "the barge-in's onset")

    def ended() -> tuple[float, dict[str, Any]] | None:
        return (caller.response_event(response_id, "output_audio_buffer.cleared")
                or caller.response_event(response_id, "output_audio_buffer.stopped"))

    cut_at, cut = await caller.wait_until(ended, BARGE_IN_TIMEOUT_S, "the reply's cut")
    if cut["type"] == "output_audio_buffer.stopped":  # it played out before the server cut it
        record.reason = "reply ended before the barge-in"
    else:
        await asyncio.sleep(max(0.0, cut_at + IN_FLIGHT_S - time.monotonic()))
        last = caller.last_loud_between(onset - 0.02, cut_at + IN_FLIGHT_S)
        record.barge_in_stop_ms = (max(onset, last or onset) - onset) * 1e3
        heard = caller.latest.get("input_audio_buffer.speech_started")
        if heard is not None and heard[0] > onset:
            record.barge_in_heard_ms = (heard[0] - onset) * 1e3
    finished = await caller.wait_until(
        lambda: caller.response_event(response_id, "response.done"), plan.turn_timeout_s,
        "response.done")
    record.status = finished[1]["response"]["status"]
    if record.status not in ("cancelled", "completed"):
        raise TurnFailedError(f"response {record.status}")
    note_continuity(caller, record, first, onset)
    return utterance


def note_continuity(caller: BenchCaller, record: TurnRecord, t0: float, t1: float) -> None:
    gaps = caller.silences_between(t0, t1)
    record.gaps_ms = max(gaps, default=0.0) * 1e3
    record.gaps = sum(1 for g in gaps if g * 1e3 >= GAP_MS)
    record.late_ms = caller.lateness_between(t0, t1) * 1e3


async def settle(caller: BenchCaller, quiet_s: float = QUIET_S, timeout_s: float = 60.0) -> None:
    """After a failed turn: wait until nothing has been heard for quiet_s (best effort)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not caller.dropped:
        last = caller.quiet_since()
        if last is None or time.monotonic() - last >= quiet_s:
            return
        await asyncio.sleep(0.2)


async def run_call(index: int, caller: BenchCaller, plan: Plan, speech: list[np.ndarray],
                   started_at: float, emit: Callable[[tuple[str, Any]], None]) -> dict[str, Any]:
    """Turns on one connected call until the plan is done; the call's record."""
    rng = random.Random(plan.seed * 100_003 + index)
    deadline = started_at + plan.duration_s if plan.duration_s is not None else None

    def may_start(turn: int) -> bool:
        if plan.turns is not None and turn > plan.turns:
            return False
        return deadline is None or time.monotonic() < deadline

    delay = rng.uniform(0.0, plan.pause_s + 1.0)  # the calls' turns interleave
    if deadline is not None:
        delay = min(delay, max(0.0, deadline - time.monotonic()))
    await asyncio.sleep(delay)
    turn, said = 0, None
    turns_ok = turns_failed = 0
    while said is not None or may_start(turn + 1):
        turn += 1
        interrupt = (plan.barge_in_every > 0 and turn % plan.barge_in_every == 0
                     and may_start(turn + 1))
        record = TurnRecord(index, turn, interrupt, started_at=time.monotonic())
        errors = caller.counts["error"]
        pcm = speech[(index + turn) % len(speech)]
        next_pcm = speech[(index + turn + 1) % len(speech)] if interrupt else None
        dropped = False
        try:
            said = await speak_turn(caller, plan, record, pcm, said, next_pcm)
            record.ok = True
        except CallDroppedError:
            record.reason, dropped = "dropped", True
        except (TurnFailedError, TimeoutError) as exc:
            record.reason = f"timeout: {exc}" if isinstance(exc, TimeoutError) else str(exc)
            said = None
        if caller.counts["error"] > errors:
            record.ok = False
            record.reason = f"error event: {describe_error(caller.errors[-1])}"
        record.ended_at = time.monotonic()
        turns_ok += record.ok
        turns_failed += not record.ok
        emit(("turn", asdict(record)))
        if dropped:
            break
        if not record.ok:
            await settle(caller)
        if said is None and may_start(turn + 1):
            pause = plan.pause_s * rng.uniform(0.75, 1.25)
            if deadline is not None:
                pause = min(pause, max(0.0, deadline - time.monotonic()))
            await asyncio.sleep(pause)
    if caller.dropped and plan.turns is not None:  # the turns it never got to
        for missed in range(turn + 1, plan.turns + 1):
            emit(("turn", asdict(TurnRecord(index, missed, False, reason="dropped"))))
            turns_failed += 1
    dropped = caller.dropped  # before our own hang-up closes the connection
    await caller.hang_up()
    return {"call": index, "connected": True, "dropped": dropped,
            "drop": None if caller.dropped_at is None else {
                "reason": caller.drop_reason, "after_s": caller.dropped_at - started_at,
                "last_events": [e["type"] for _, e in list(caller.recent)[-5:]]},
            "error_events": caller.counts["error"],
            "errors": [describe_error(e) for e in caller.errors[:5]],
            "turns_ok": turns_ok, "turns_failed": turns_failed,
            "rtp_misses": caller.rtp_misses}


def describe_error(event: dict[str, Any]) -> str:
    error = event.get("error") or {}
    return f"{error.get('type', '?')}/{error.get('code', '?')}: {error.get('message', '')}"[:200]


async def connect_call(index: int, plan: Plan, gate: asyncio.Semaphore
                       ) -> tuple[BenchCaller | None, dict[str, Any]]:
    """A connected caller (with the plan's reply length set), or None and why not."""
    caller = BenchCaller(plan.url, plan.api_key, plan.codec)
    began = time.monotonic()
    try:
        async with gate:
            await caller.connect(plan.connect_timeout_s)
            if plan.reply_tokens is not None:
                caller.send({"type": "session.update", "session": {
                    "type": "realtime", "max_output_tokens": plan.reply_tokens}})
                await caller.wait_for("session.updated", 1, plan.connect_timeout_s)
    except Exception as exc:  # refused (503), timed out, failed ICE: the call did not happen
        with contextlib.suppress(Exception):
            await caller.hang_up()
        status = getattr(getattr(exc, "response", None), "status_code", None)
        reason = f"HTTP {status}" if status else f"{type(exc).__name__}: {exc}"[:200]
        return None, {"call": index, "connected": False, "reason": reason}
    detection = caller.last("session.created")[1]["session"]["audio"]["input"]["turn_detection"]
    return caller, {"call": index, "connected": True,
                    "connect_ms": (time.monotonic() - began) * 1e3,
                    "silence_ms": detection.get("silence_duration_ms")}


# -- worker processes ------------------------------------------------------------------------

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
        cores = (None if began is None or cpu_began is None else
                 (time.process_time() - cpu_began) / max(1e-9, time.monotonic() - began))
        out.put(("worker", {"pid": os.getpid(), "loop_lag_p99_ms": p99, "cpu_cores": cores}))


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
        run.server = server_figures(watch, run.started_at, ended_at, before, watch.snapshot(),
                                    cpu_before, watch.cpu())
    return run


# -- the command -----------------------------------------------------------------------------

@dataclass
class Options:
    """`omnivox bench calls` as given on the command line."""

    concurrency: list[int]
    turns: int | None = 5
    duration_s: float | None = None
    url: str | None = None
    profile: str = "tiny"
    models_dir: Path | None = None
    workers: int | None = None
    pause_s: float = 1.0
    barge_in_every: int = 3
    reply_tokens: int | None = None
    codec: str | None = None
    api_key: str | None = None
    compare_sequential: bool = False
    sequential_url: str | None = None
    speech_dir: Path | None = None
    json_path: Path | None = None
    plots_dir: Path | None = None
    progress: bool = True


def bench_calls(options: Options) -> dict[str, Any]:
    """Run the sweep (and the sequential comparison); the figures."""
    if options.url is not None and options.compare_sequential and not options.sequential_url:
        raise ValueError("--compare-sequential with --url needs --sequential-url: a second "
                         "server started with `omnivox serve --sequential-stages`")
    speech = utterance_wavs(QUESTIONS, options.speech_dir or default_speech_dir())
    workers = options.workers or max(1, os.cpu_count() or 1)
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else None
    base = Plan(url="", concurrency=1, speech=speech, turns=options.turns,
                duration_s=options.duration_s, pause_s=options.pause_s,
                barge_in_every=options.barge_in_every, reply_tokens=options.reply_tokens,
                codec=options.codec, api_key=options.api_key)

    def sweep(url: str, pid: int | None, levels: list[int]) -> list[dict[str, Any]]:
        out = []
        with ServerWatch(url, pid, headers=headers) as watch:
            for n in levels:
                wait_calls_ended(url, headers=headers)
                run = run_level(replace(base, url=url, concurrency=n), workers, watch,
                                options.progress)
                out.append(summarise(run))
        return out

    result: dict[str, Any] = {"profile": None if options.url else options.profile,
                              "url": options.url, "plan": {
                                  k: v for k, v in asdict(base).items()
                                  if k not in ("url", "concurrency", "speech", "api_key")},
                              "workers": workers, "targets": TARGETS, "sequential": None,
                              "cascade_vs_sequential": None}
    top = max(options.concurrency)
    if options.url is not None:
        result["server_label"] = f"the server at {options.url}"
        result["levels"] = sweep(options.url, None, options.concurrency)
    else:
        result["server_label"] = f"`omnivox serve --profile {options.profile}` (started here)"
        with ServerProcess(options.profile, models_dir=options.models_dir,
                           max_calls=top) as server:
            result["levels"] = sweep(server.url, server.pid, options.concurrency)
    if options.compare_sequential:
        first = min(options.concurrency)
        if options.sequential_url is not None:
            result["sequential"] = sweep(options.sequential_url, None, [first])[0]
        else:
            with ServerProcess(options.profile, models_dir=options.models_dir,
                               max_calls=first, sequential=True) as server:
                result["sequential"] = sweep(server.url, server.pid, [first])[0]
        cascade = next(level for level in result["levels"] if level["concurrency"] == first)
        c, s = cascade["ttfa_after_vad_ms"]["p50"], result["sequential"]["ttfa_after_vad_ms"]["p50"]
        result["cascade_vs_sequential"] = {
            "concurrency": first, "cascade_ms": c, "sequential_ms": s,
            "cascade_ttfa_ms": cascade["ttfa_ms"]["p50"],
            "sequential_ttfa_ms": result["sequential"]["ttfa_ms"]["p50"],
            "ratio": s / c if c and s else None}
    return result


def run(options: Options) -> int:
    """`omnivox bench calls`: print the table, write the JSON and the plots."""
    result = bench_calls(options)
    if options.plots_dir is not None:
        from agent.bench.plots import plot_levels

        result["plots"] = [str(p) for p in plot_levels(result, options.plots_dir)]
    print(report(result))
    if options.json_path is not None:
        options.json_path.parent.mkdir(parents=True, exist_ok=True)
        options.json_path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"omnivox bench: results written to {options.json_path}")
    if result.get("plots"):
        print(f"omnivox bench: plots written to {', '.join(result['plots'])}")
    failed = any(level["turns_ok"] == 0 for level in result["levels"])
    return 1 if failed else 0
