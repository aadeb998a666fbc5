"""What one simulated caller of `omnivox bench calls` does in its call: connect, speak, listen,
talk over a reply, and record each turn as a caller feels it."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from agent.bench.caller import BenchCaller, CallDroppedError
from agent.bench.level import Plan
from agent.bench.light_caller import LightCaller
from agent.bench.microphone import Utterance
from agent.bench.speech import MIC_RATE
from agent.bench.turn_stamps import turn_stamps

SAMPLE_RATE = MIC_RATE  # the callers' microphones run at 16 kHz
GAP_MS = 100  # a silence this long inside a reply counts as a gap
BARGE_IN_TIMEOUT_S = 10.0  # the server must cut a talked-over reply within this
IN_FLIGHT_S = 0.2  # reply audio already on the wire when the cut was announced
QUIET_S = 1.5  # after a failed turn: silence heard this long before the next utterance


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
    barge_in_cut_ms: float | None = None  # our onset -> the server's cut (`cleared`) arrived
    gaps_ms: float | None = None  # longest silence inside the reply
    gaps: int = 0  # silences of GAP_MS or more inside the reply
    late_ms: float | None = None  # longest late arrival against the stream's pace
    status: str | None = None  # the reply's response.done status
    started_at: float = 0.0
    ended_at: float = 0.0
    response_id: str | None = None
    speech_end_unix: float | None = None  # the caller's end of speech, wall clock (turn_stamps)


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

    record.response_id = response_id
    record.speech_end_unix = end + (time.time() - time.monotonic())

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
        record.barge_in_cut_ms = (cut_at - onset) * 1e3
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
    finished: list[TurnRecord] = []  # the turns whose server stamps are read at the end
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
        finished.append(record)
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
    call_s = time.monotonic() - started_at  # live from the go to its last turn's end
    if not dropped:
        spoken = [(r.turn, r.response_id, r.speech_end_unix) for r in finished]
        emit(("stamps", {"call": index, "turns": await turn_stamps(caller, spoken)}))
    await caller.hang_up()
    return {"call": index, "connected": True, "dropped": dropped,
            "drop": None if caller.dropped_at is None else {
                "reason": caller.drop_reason, "after_s": caller.dropped_at - started_at,
                "last_events": [e["type"] for _, e in list(caller.recent)[-5:]]},
            "error_events": caller.counts["error"],
            "errors": [describe_error(e) for e in caller.errors[:5]],
            "turns_ok": turns_ok, "turns_failed": turns_failed,
            "rtp_misses": caller.rtp_misses, "call_s": call_s}


def describe_error(event: dict[str, Any]) -> str:
    error = event.get("error") or {}
    return f"{error.get('type', '?')}/{error.get('code', '?')}: {error.get('message', '')}"[:200]


def session_update(plan: Plan) -> dict[str, Any] | None:
    """The session.update the plan's callers send once connected (None: the server's session):
    the reply length, and the turn detection (semantic_vad with its eagerness)."""
    session: dict[str, Any] = {}
    if plan.reply_tokens is not None:
        session["max_output_tokens"] = plan.reply_tokens
    if plan.turn_detection is not None:
        detection = {"type": plan.turn_detection}
        if plan.eagerness is not None:
            detection["eagerness"] = plan.eagerness
        session["audio"] = {"input": {"turn_detection": detection}}
    return {"type": "session.update", "session": {"type": "realtime", **session}} if (
        session) else None


async def connect_call(index: int, plan: Plan, gate: asyncio.Semaphore
                       ) -> tuple[BenchCaller | None, dict[str, Any]]:
    """A connected caller (with the plan's session set), or None and why not."""
    kind = LightCaller if plan.callers == "light" else BenchCaller
    caller = kind(plan.url, plan.api_key, plan.codec)
    began = time.monotonic()
    update = session_update(plan)
    try:
        async with gate:
            await caller.connect(plan.connect_timeout_s)
            if update is not None:
                caller.send(update)
                await caller.wait_for("session.updated", 1, plan.connect_timeout_s)
    except Exception as exc:  # refused (503), timed out, failed ICE: the call did not happen
        with contextlib.suppress(Exception):
            await caller.hang_up()
        return None, {"call": index, "connected": False, "reason": refusal_reason(exc)}
    session = caller.last("session.updated" if update else "session.created")[1]["session"]
    detection = session["audio"]["input"]["turn_detection"] or {}
    return caller, {"call": index, "connected": True,
                    "connect_ms": (time.monotonic() - began) * 1e3,
                    # semantic_vad has no fixed silence: its turns end at a judged pause
                    "silence_ms": detection.get("silence_duration_ms"),
                    "turn_detection": detection.get("type"),
                    "eagerness": detection.get("eagerness")}


NUMBER = re.compile(r"\d+(?:\.\d+)?")  # a figure in a refusal's message


def refusal_reason(exc: Exception) -> str:
    """Why an offer did not become a call, grouped for counting: the HTTP status and the
    server's error code and message, its figures left out (`HTTP 503 server_busy: server busy:
    the event loop ran N ms late in the last N s (limit N ms)`), or the exception."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if not status:
        return f"{type(exc).__name__}: {exc}"[:200]
    try:
        error = response.json()["error"]  # type: ignore[union-attr]
        said = f" {error['code']}: {NUMBER.sub('N', error['message'])}"
    except Exception:  # not the OpenAI error shape: the status is all there is
        said = ""
    return f"HTTP {status}{said}"[:200]
