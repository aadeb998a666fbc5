"""`omnivox bench calls`: time to first audio, barge-in and capacity, measured the way callers feel
them, over many concurrent WebRTC calls.

A load generator: `concurrency` simulated callers (aiortc peers, `BenchCaller`) spread over
worker processes (spawned; each runs one asyncio loop with its share of the callers), so the
generator is not what runs out of CPU first. Each caller speaks utterances made once with
espeak-ng (cached as 16 kHz WAVs, trimmed to their audible part), waits for the reply, pauses,
and speaks again; every `barge_in_every`-th reply is talked over by the next utterance once
`barge_in_after_s` of it has been heard. Per turn, at the caller:

- time to first audio: from the end of the caller's speech to the first loud sample of the
  reply (both on the media timeline, see agent/bench_caller.py). It includes the server's
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
import hashlib
import json
import logging
import multiprocessing
import os
import queue as queue_module
import random
import shutil
import subprocess
import tempfile
import time
import wave
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from agent.bench_caller import MIC_RATE, BenchCaller, CallDroppedError, Utterance, resample
from agent.bench_server import ServerProcess, ServerWatch, server_figures, wait_calls_ended
from agent.bench_turn import QUESTIONS

SAMPLE_RATE = MIC_RATE  # the callers' microphones run at 16 kHz
GAP_MS = 100  # a silence this long inside a reply counts as a gap
BARGE_IN_TIMEOUT_S = 10.0  # the server must cut a talked-over reply within this
IN_FLIGHT_S = 0.2  # reply audio already on the wire when the cut was announced
QUIET_S = 1.5  # after a failed turn: silence heard this long before the next utterance
CONNECTS_AT_ONCE = 4  # per worker process: offers in flight together (ICE and DTLS cost CPU)
HANG_UP_S = 60.0  # after the last call's record: workers still hanging up are then ended
TARGETS = {  # issue 7, for the tiny family
    "ttfa_p50_ms_at_1": 150.0,
    "ttfa_p50_ms_at_16": 500.0,
    "barge_in_stop_p95_ms": 300.0,
    "calls_held": 64,
}


@dataclass(frozen=True)
class Plan:
    """What every caller of one level does (picklable: it travels to the worker processes)."""

    url: str
    concurrency: int
    speech: tuple[str, ...]  # WAV files: 16 kHz mono int16, trimmed to the audible part
    turns: int | None = 5  # per call; or None with duration_s
    duration_s: float | None = None  # keep starting turns until this long after the start
    pause_s: float = 1.0  # after a reply has played, before the next utterance
    barge_in_every: int = 3  # every n-th reply is talked over by the next utterance; 0: never
    barge_in_after_s: float = 0.6  # reply heard before the caller talks over it
    reply_tokens: int | None = None  # session.update max_output_tokens; None: the server's
    codec: str | None = None  # offer only this codec (opus, PCMU, PCMA); None: all
    api_key: str | None = None
    turn_timeout_s: float = 60.0
    connect_timeout_s: float = 60.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if (self.turns is None) == (self.duration_s is None):
            raise ValueError("give either turns or duration_s")
        if self.turns is not None and self.turns < 1:
            raise ValueError("turns must be at least 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("duration_s must be positive")
        if self.barge_in_every < 0 or self.barge_in_every == 1:
            raise ValueError("barge_in_every must be 0 (never) or at least 2")
        if not self.speech:
            raise ValueError("no utterances to speak")


# -- speech ----------------------------------------------------------------------------------

def default_speech_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "omnivox" / "bench-speech"


def utterance_wavs(texts: Iterable[str], directory: Path) -> tuple[str, ...]:
    """Each text spoken by espeak-ng, as a cached 16 kHz mono WAV trimmed to its audible part
    (so an utterance's first and last frames are its onset and its end)."""
    espeak = shutil.which("espeak-ng")
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for text in texts:
        digest = hashlib.sha256(f"espeak-ng/16k/trim1:{text}".encode()).hexdigest()[:16]
        path = directory / f"{digest}.wav"
        if not path.exists():
            if espeak is None:
                raise RuntimeError("espeak-ng is not installed (Debian package espeak-ng)")
            with tempfile.TemporaryDirectory(prefix="bench-speech-") as scratch:
                raw = Path(scratch) / "raw.wav"
                subprocess.run([espeak, "-w", str(raw), text], check=True, capture_output=True)
                pcm, rate = read_wav(raw)
            pcm = resample(trim(pcm, rate), rate, SAMPLE_RATE)
            part = path.with_suffix(".part")
            write_wav(part, pcm)
            part.replace(path)  # whole files only, even with several runs at once
        paths.append(str(path))
    return tuple(paths)


def read_wav(path: Path | str) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as wav:
        if wav.getsampwidth() != 2 or wav.getnchannels() != 1:
            raise ValueError(f"{path}: want 16-bit mono PCM")
        return (np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.int16),
                wav.getframerate())


def write_wav(path: Path, pcm: np.ndarray, rate: int = SAMPLE_RATE) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm.astype("<i2").tobytes())


def trim(pcm: np.ndarray, rate: int, threshold_dbfs: float = -50.0) -> np.ndarray:
    """`pcm` from its first to its last 5 ms window louder than threshold_dbfs."""
    window = max(1, rate // 200)
    n = len(pcm) // window
    blocks = pcm[: n * window].astype(np.float64).reshape(n, window)
    loud = np.flatnonzero(np.sqrt((blocks * blocks).mean(axis=1))
                          > 32768.0 * 10 ** (threshold_dbfs / 20))
    if loud.size == 0:
        raise ValueError("the utterance is silent")
    return pcm[int(loud[0]) * window:(int(loud[-1]) + 1) * window]


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
    from agent.loop_lag import LoopLagMonitor

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


@dataclass
class LevelRun:
    """Everything one level produced, before it is summarised."""

    plan: Plan
    calls: list[dict[str, Any]]
    turns: list[dict[str, Any]]
    workers: list[dict[str, Any]]
    began: float  # the workers were started (monotonic)
    started_at: float  # every call connected: the go
    ended_at: float
    server: dict[str, Any] | None = None


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


# -- figures ---------------------------------------------------------------------------------

def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "max": None, "n": 0}
    p50, p95 = np.percentile(values, [50, 95]).tolist()
    return {"p50": p50, "p95": p95, "max": float(max(values)), "n": len(values)}


def summarise(run: LevelRun) -> dict[str, Any]:
    """One level's figures (the JSON's `levels` entries)."""
    ok = [t for t in run.turns if t["ok"]]
    failed = [t for t in run.turns if not t["ok"]]
    connected = [c for c in run.calls if c.get("connected")]
    silence = next((c["silence_ms"] for c in connected if c.get("silence_ms") is not None), None)
    ttfa = [t["ttfa_ms"] for t in ok if t["ttfa_ms"] is not None]
    barge = [t["barge_in_stop_ms"] for t in ok if t["barge_in_stop_ms"] is not None]
    heard = [(t["barge_in_stop_ms"], t["barge_in_heard_ms"]) for t in ok
             if t["barge_in_stop_ms"] is not None and t["barge_in_heard_ms"] is not None]
    last_done = max((t["ended_at"] for t in ok), default=run.started_at)
    busy_s = max(1e-9, last_done - run.started_at)
    lags = [w["loop_lag_p99_ms"] for w in run.workers if w.get("loop_lag_p99_ms") is not None]
    level = {
        "concurrency": run.plan.concurrency,
        "calls_connected": len(connected),
        "calls_refused": run.plan.concurrency - len(connected),
        "calls_dropped": sum(1 for c in connected if c.get("dropped")),
        "drops": [c["drop"] for c in connected if c.get("drop")][:5],
        "refusals": dict(Counter(c["reason"] for c in run.calls if not c.get("connected"))),
        "connect_s": run.started_at - run.began,
        "connect_ms": percentiles([c["connect_ms"] for c in connected if "connect_ms" in c]),
        "turns_ok": len(ok),
        "turns_failed": len(failed),
        "failures": dict(Counter((t["reason"] or "?").split(" within")[0] for t in failed)),
        "error_events": sum(c.get("error_events", 0) for c in connected),
        "errors": sorted({e for c in connected for e in c.get("errors", [])})[:5],
        "ttfa_ms": percentiles(ttfa),
        "silence_ms": silence,
        "ttfa_after_vad_ms": percentiles([v - silence for v in ttfa] if silence else []),
        "barge_in_stop_ms": percentiles(barge),
        # The server's speech_started (its VAD has 60 ms of the caller's speech) arrived this
        # long after our onset; the stop time counted from there instead.
        "barge_in_heard_ms": percentiles([h for _, h in heard]),
        "barge_in_stop_after_heard_ms": percentiles([s - h for s, h in heard]),
        "barge_ins_planned": sum(1 for t in run.turns if t["barge_in"]),
        "gaps_ms_max": max((t["gaps_ms"] for t in ok if t["gaps_ms"] is not None), default=None),
        "gaps": sum(t["gaps"] for t in ok),
        "late_ms_max": max((t["late_ms"] for t in ok if t["late_ms"] is not None),
                           default=None),
        "turns_per_s": len(ok) / busy_s,
        "wall_s": run.ended_at - run.started_at,
        "generator_loop_lag_p99_ms": max(lags) if lags else None,
        "generator_cpu_cores": sum(w.get("cpu_cores") or 0.0 for w in run.workers),
        "rtp_misses": sum(c.get("rtp_misses", 0) for c in connected),
        "server": run.server,
        "samples": {"ttfa_ms": sorted(ttfa), "barge_in_stop_ms": sorted(barge)},
    }
    crashed = [c["crashed"] for c in connected if c.get("crashed")]
    if crashed:
        level["crashed"] = crashed[:3]
    return level


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(result: dict[str, Any]) -> str:
    """The terminal table: one row per level, then the targets."""
    head = (f"{'calls':>5} {'held':>5} {'drop':>4} {'ok':>5} {'fail':>4} {'ttfa p50':>9} "
            f"{'p95':>6} {'-vad p50':>9} {'p95':>6} {'barge p50':>9} {'p95':>6} {'gap max':>8} "
            f"{'late max':>8} {'turns/s':>7} {'srv lag p99':>11} {'gen lag p99':>11}")
    lines = [f"omnivox bench calls: {result['server_label']}; milliseconds at the caller "
             f"(ttfa: end of speech -> first reply audio; -vad: less the "
             f"{fmt(result['levels'][0].get('silence_ms'))} ms end-of-turn silence)", head]
    rows = [*result["levels"]]
    if result.get("sequential"):
        rows.append({**result["sequential"], "label": "seq"})
    for level in rows:
        server = level.get("server") or {}
        lag = server.get("event_loop_lag_p99_ms")
        label = level.get("label") or str(level["concurrency"])
        lines.append(
            f"{label:>5} {level['calls_connected']:>5} {level['calls_dropped']:>4} "
            f"{level['turns_ok']:>5} {level['turns_failed']:>4} "
            f"{fmt(level['ttfa_ms']['p50']):>9} {fmt(level['ttfa_ms']['p95']):>6} "
            f"{fmt(level['ttfa_after_vad_ms']['p50']):>9} "
            f"{fmt(level['ttfa_after_vad_ms']['p95']):>6} "
            f"{fmt(level['barge_in_stop_ms']['p50']):>9} "
            f"{fmt(level['barge_in_stop_ms']['p95']):>6} {fmt(level['gaps_ms_max']):>8} "
            f"{fmt(level['late_ms_max']):>8} {level['turns_per_s']:>7.2f} {fmt(lag, 1):>11} "
            f"{fmt(level['generator_loop_lag_p99_ms'], 1):>11}")
        if level["failures"] or level["refusals"]:
            lines.append(f"      failures {level['failures']} refusals {level['refusals']}")
        if level["errors"]:
            lines.append(f"      error events: {level['errors']}")
    if result.get("cascade_vs_sequential"):
        c = result["cascade_vs_sequential"]
        lines.append(f"cascade vs sequential stages at {c['concurrency']} call(s), first audio "
                     f"after the end-of-turn silence p50: {fmt(c['cascade_ms'])} vs "
                     f"{fmt(c['sequential_ms'])} ms: {fmt(c['ratio'], 2)}x sooner")
    lines += [f"target (issue 7, tiny family): {line}" for line in verdicts(result["levels"])]
    return "\n".join(lines)


def verdicts(levels: list[dict[str, Any]]) -> list[str]:
    """The issue's targets (stated for the tiny family) against these figures."""
    by = {level["concurrency"]: level for level in levels}
    out = []
    for n, key in ((1, "ttfa_p50_ms_at_1"), (16, "ttfa_p50_ms_at_16")):
        if n in by:
            raw, net = by[n]["ttfa_ms"]["p50"], by[n]["ttfa_after_vad_ms"]["p50"]
            limit = TARGETS[key]
            met = net is not None and net < limit
            out.append(f"time to first audio p50 < {limit:.0f} ms at {n} call(s): "
                       f"{fmt(net)} ms after the end-of-turn silence ({fmt(raw)} ms from the "
                       f"end of speech): {'met' if met else 'MISSED'}")
    barge = [level["barge_in_stop_ms"]["p95"] for level in levels
             if level["barge_in_stop_ms"]["p95"] is not None]
    if barge:
        limit = TARGETS["barge_in_stop_p95_ms"]
        after = [level["barge_in_stop_after_heard_ms"]["p95"] for level in levels
                 if level["barge_in_stop_after_heard_ms"]["p95"] is not None]
        out.append(f"barge-in stop p95 < {limit:.0f} ms: worst level {max(barge):.0f} ms from "
                   f"the caller's onset ({fmt(max(after, default=None))} ms after the server's "
                   f"speech_started arrived): {'met' if max(barge) < limit else 'MISSED'}")
    held = TARGETS["calls_held"]
    if held in by:
        level = by[held]
        met = level["calls_connected"] == held and not level["calls_dropped"]
        out.append(f"{held} concurrent calls held without drops: {level['calls_connected']} "
                   f"connected, {level['calls_dropped']} dropped: {'met' if met else 'MISSED'}")
    return out


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
        from agent.bench_plots import plot_levels

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
