"""`omnivox bench calls`' figures: one level's summary (the JSON), the table and the targets."""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

import numpy as np

from agent.bench.capacity import PACING_LIMIT_MS, best_calls_per_core, callers_cpu_per_call
from agent.bench.level import LevelRun
from agent.bench.turn_stamps import FIGURES as STAMP_FIGURES


class FirstAudioTarget(NamedTuple):
    """First audio p50 at the caller, at most `ms`: `figure` is ttfa_after_vad_ms (after the
    end-of-turn silence) or ttfa_ms (from the end of speech)."""

    calls: int
    figure: str
    turn_detection: str
    ms: float


FIRST_AUDIO_TARGETS: dict[str, tuple[FirstAudioTarget, ...]] = {  # per profile
    "tiny": (FirstAudioTarget(1, "ttfa_after_vad_ms", "server_vad", 150.0),
             FirstAudioTarget(4, "ttfa_after_vad_ms", "server_vad", 300.0),
             FirstAudioTarget(16, "ttfa_after_vad_ms", "server_vad", 500.0)),
    "local": (FirstAudioTarget(1, "ttfa_ms", "server_vad", 900.0),
              FirstAudioTarget(1, "ttfa_ms", "semantic_vad", 700.0)),
}
TARGETS = {  # at the caller, whatever the profile
    "barge_in_stop_p95_ms": 300.0,
    "calls_held": 64,
    "calls_per_core": 32,  # of the call plane, at a pacing lateness p99 under 20 ms
}


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p95": None, "max": None, "n": 0}
    p50, p90, p95 = np.percentile(values, [50, 90, 95]).tolist()
    return {"p50": p50, "p90": p90, "p95": p95, "max": float(max(values)), "n": len(values)}


def stamps_summary(ok: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the turns' time to first audio went (agent/bench/turn_stamps.py): each figure's
    percentiles, the last leg (the first audio queued for the caller to the first sound it
    heard: the outbound queue, pacing, network, the voice's quiet lead-in), and each turn's."""
    stamped = [t for t in ok if t.get("stamps") and t["ttfa_ms"] is not None]
    out: dict[str, Any] = {
        key: percentiles([t["stamps"][key] for t in stamped if t["stamps"][key] is not None])
        for key in STAMP_FIGURES}
    out["heard_after_queued_ms"] = percentiles([
        t["ttfa_ms"] - t["stamps"]["first_audio_queued_ms"] for t in stamped
        if t["stamps"]["first_audio_queued_ms"] is not None])
    out["turns"] = [{"ttfa_ms": t["ttfa_ms"], **t["stamps"]} for t in stamped]
    return out


def longest_gap(ok: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The turn with the longest silence inside its reply, with the server's stamps of it (its
    underruns say whether the server's queue ran dry then, or the gap came after it)."""
    gapped = [t for t in ok if t["gaps_ms"]]
    if not gapped:
        return None
    turn = max(gapped, key=lambda t: t["gaps_ms"])
    keys = ("call", "turn", "gaps_ms", "gaps", "late_ms", "ttfa_ms", "barge_in", "stamps")
    return {key: turn.get(key) for key in keys}


def summarise(run: LevelRun) -> dict[str, Any]:
    """One level's figures (the JSON's `levels` entries)."""
    ok = [t for t in run.turns if t["ok"]]
    failed = [t for t in run.turns if not t["ok"]]
    connected = [c for c in run.calls if c.get("connected")]
    silence = next((c["silence_ms"] for c in connected if c.get("silence_ms") is not None), None)
    detection = next((c for c in connected if c.get("turn_detection")), {})
    ttfa = [t["ttfa_ms"] for t in ok if t["ttfa_ms"] is not None]
    barge = [t["barge_in_stop_ms"] for t in ok if t["barge_in_stop_ms"] is not None]
    heard = [(t["barge_in_stop_ms"], t["barge_in_heard_ms"]) for t in ok
             if t["barge_in_stop_ms"] is not None and t["barge_in_heard_ms"] is not None]
    cut = [(t["barge_in_stop_ms"], t["barge_in_cut_ms"]) for t in ok
           if t["barge_in_stop_ms"] is not None and t.get("barge_in_cut_ms") is not None]
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
        "turn_detection": detection.get("turn_detection"),
        "eagerness": detection.get("eagerness"),
        "silence_ms": silence,
        "ttfa_after_vad_ms": percentiles([v - silence for v in ttfa] if silence else []),
        "barge_in_stop_ms": percentiles(barge),
        # The server's speech_started (its VAD has 60 ms of the caller's speech) arrived this
        # long after our onset; the stop time counted from there instead.
        "barge_in_heard_ms": percentiles([h for _, h in heard]),
        "barge_in_stop_after_heard_ms": percentiles([s - h for s, h in heard]),
        # Where the stop went: our onset -> the server's cut (`output_audio_buffer.cleared`)
        # arrived (its barge_in_min_ms of speech, the way in, its decision), then the reply
        # still heard after the cut (audio already sent, the decoder's tail).
        "barge_in_cut_ms": percentiles([c for _, c in cut]),
        "barge_in_after_cut_ms": percentiles([s - c for s, c in cut]),
        "barge_ins_planned": sum(1 for t in run.turns if t["barge_in"]),
        "gaps_ms_max": max((t["gaps_ms"] for t in ok if t["gaps_ms"] is not None), default=None),
        "gaps": sum(t["gaps"] for t in ok),
        "longest_gap": longest_gap(ok),
        "late_ms_max": max((t["late_ms"] for t in ok if t["late_ms"] is not None),
                           default=None),
        "turns_per_s": len(ok) / busy_s,
        "wall_s": run.ended_at - run.started_at,
        "generator_loop_lag_p99_ms": max(lags) if lags else None,
        "generator_cpu_cores": sum(w.get("cpu_cores") or 0.0 for w in run.workers),
        "rtp_misses": sum(c.get("rtp_misses", 0) for c in connected),
        "time_went_ms": stamps_summary(ok),
        "server": run.server,
        "samples": {"ttfa_ms": sorted(ttfa), "barge_in_stop_ms": sorted(barge)},
    }
    call_seconds = sum(c.get("call_s") or 0.0 for c in connected)
    level["capacity"] = {**(run.server or {}).pop("capacity", {}), "callers": run.plan.callers,
                         "callers_cpu_per_call": callers_cpu_per_call(run.workers, call_seconds)}
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
            f"{'late max':>8} {'turns/s':>7} {'srv lag p99':>11} {'gen lag p99':>11} "
            f"{'pace p99':>8} {'srv cpu/call':>12} {'callers cpu/call':>16}")
    lines = [f"omnivox bench calls: {result['server_label']}; milliseconds at the caller "
             f"(ttfa: end of speech -> first reply audio; -vad: less the "
             f"{fmt(result['levels'][0].get('silence_ms'))} ms end-of-turn silence; pace p99: "
             f"the server's outbound frames against their clock; cpu/call: CPU seconds per "
             f"call-second of the API process and of the {callers_of(result)} callers)", head]
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
            f"{fmt(level['generator_loop_lag_p99_ms'], 1):>11} {capacity_columns(level)}")
        if level["failures"] or level["refusals"]:
            lines.append(f"      failures {level['failures']} refusals {level['refusals']}")
        if level["errors"]:
            lines.append(f"      error events: {level['errors']}")
        if (level.get("time_went_ms") or {}).get("turns"):
            lines.append(f"      {where_time_went(level)}")
        if any((server.get("preemptive_replies") or {}).values()):
            counts = server["preemptive_replies"]
            lines.append("      preemptive replies (vad.pause_ms): "
                         + ", ".join(f"{k} {v:.0f}" for k, v in counts.items()))
    if result.get("cascade_vs_sequential"):
        c = result["cascade_vs_sequential"]
        lines.append(f"cascade vs sequential stages at {c['concurrency']} call(s), first audio "
                     f"after the end-of-turn silence p50: {fmt(c['cascade_ms'])} vs "
                     f"{fmt(c['sequential_ms'])} ms: {fmt(c['ratio'], 2)}x sooner")
    profile = result.get("profile") or "the server"
    lines += [f"target ({profile}): {line}"
              for line in verdicts(result["levels"], result.get("profile"))]
    lines.append(capacity_verdict(result["levels"]))
    return "\n".join(lines)


def where_time_went(level: dict[str, Any]) -> str:
    """One line: the p50 of each stamp, in ms after the end of speech (pipeline marks after the
    pipeline turn began)."""
    went = level["time_went_ms"]
    mode = level.get("turn_detection") or "server_vad"
    if level.get("eagerness"):
        mode += f" {level['eagerness']}"
    parts = [f"{name} {fmt(went[key]['p50'])}" for key, name in (
        ("turn_began_ms", "turn began"), ("asr_ms", "| pipeline: asr"),
        ("thinker_first_token_ms", "thinker 1st token"),
        ("talker_first_tokens_ms", "talker 1st tokens"),
        ("voicebox_first_chunk_ms", "voicebox 1st chunk |"),
        ("first_audio_queued_ms", "queued"), ("heard_after_queued_ms", "+ heard after"))]
    return f"p50 ms after the end of speech ({mode}): " + ", ".join(parts)


def verdicts(levels: list[dict[str, Any]], profile: str | None) -> list[str]:
    """The issue's targets against these figures (first audio: the profile's own)."""
    by = {(level["concurrency"], level.get("turn_detection") or "server_vad"): level
          for level in levels}
    out = []
    for n, key, detection, limit in FIRST_AUDIO_TARGETS.get(profile or "", ()):
        if (level := by.get((n, detection))) is None:
            continue
        value = level[key]["p50"]
        where = ("after the end-of-turn silence" if key == "ttfa_after_vad_ms"
                 else "from the end of speech")
        met = value is not None and value < limit
        out.append(f"time to first audio p50 < {limit:.0f} ms {where} at {n} call(s), "
                   f"{detection}: {fmt(value)} ms: {'met' if met else 'MISSED'}")
    barge = [level["barge_in_stop_ms"]["p95"] for level in levels
             if level["barge_in_stop_ms"]["p95"] is not None]
    if barge:
        limit = TARGETS["barge_in_stop_p95_ms"]
        after = [level["barge_in_stop_after_heard_ms"]["p95"] for level in levels
                 if level["barge_in_stop_after_heard_ms"]["p95"] is not None]
        worst = max((lv for lv in levels if lv["barge_in_stop_ms"]["p95"] is not None),
                    key=lambda lv: lv["barge_in_stop_ms"]["p95"])
        out.append(f"barge-in stop p95 < {limit:.0f} ms: worst level {max(barge):.0f} ms from "
                   f"the caller's onset ({fmt(max(after, default=None))} ms after the server's "
                   f"speech_started arrived; at that level the cut arrived "
                   f"{fmt(worst['barge_in_cut_ms']['p95'])} ms after the onset, p95, the reply "
                   f"was heard {fmt(worst['barge_in_after_cut_ms']['p95'])} ms after the cut): "
                   f"{'met' if max(barge) < limit else 'MISSED'}")
    held = int(TARGETS["calls_held"])
    if (level := next((lv for lv in levels if lv["concurrency"] == held), None)) is not None:
        met = level["calls_connected"] == held and not level["calls_dropped"]
        out.append(f"{held} concurrent calls held without drops: {level['calls_connected']} "
                   f"connected, {level['calls_dropped']} dropped: {'met' if met else 'MISSED'}")
    return out


def callers_of(result: dict[str, Any]) -> str:
    return str((result["levels"][0].get("capacity") or {}).get("callers", "full"))


def capacity_columns(level: dict[str, Any]) -> str:
    capacity = level.get("capacity") or {}
    plane, callers = capacity.get("call_plane_cpu_per_call"), capacity.get("callers_cpu_per_call")
    return (f"{fmt(capacity.get('pacing_late_p99_ms'), 1):>8} "
            f"{fmt(None if plane is None else plane * 100, 2) + '%':>12} "
            f"{fmt(None if callers is None else callers * 100, 2) + '%':>16}")


def capacity_verdict(levels: list[dict[str, Any]]) -> str:
    """Calls per core of the call plane at the busiest level whose pacing stayed on time."""
    best, want = best_calls_per_core(levels), TARGETS["calls_per_core"]
    head = f"calls per core of the call plane at pacing p99 < {PACING_LIMIT_MS:.0f} ms"
    if best is None:
        return f"{head}: no level on time, or no server CPU and /metrics to judge it by"
    met = best["calls_per_core"] >= want
    return (f"{head}: {best['calls_per_core']:.1f} at {best['concurrency']} calls (pacing p99 "
            f"{best['pacing_late_p99_ms']:.1f} ms); target >= {want}: "
            f"{'met' if met else 'MISSED'}")
