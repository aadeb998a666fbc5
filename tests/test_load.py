"""The load test: concurrent calls from aiortc clients for a minute on the tiny family.

The server is `omnivox serve --profile tiny` in a process of its own (so the API process's RSS is
its alone) and the callers are `omnivox bench calls`' load generator (agent/bench/load.py) in
two worker processes: each call speaks a short utterance, hears the reply out (every fourth one
it talks over), pauses, and speaks again until the time is up. Required: every call connected
and none dropped, no `error` event, the API process's RSS at the end within 10% of its RSS once
warm (at minute 1; half-way through a run shorter than two minutes).
The event loop's lag p99 (the server's own histogram) and the caller-side figures are printed,
not asserted: on a 2-core machine shared with the engines and the calling peers, they say how
loaded it was, not whether the server is right.

`make test` runs 16 calls: what this 2-core machine carries with its callers on the same cores
(at 32, the callers alone took 1.25 cores and the server's loop lagged seconds, so callers'
ICE consent checks failed and they hung up; later the calls held, but the Thinker's engine
starved). `make soak` runs 16 calls for ten minutes (OMNIVOX_LOAD_CALLS,
OMNIVOX_LOAD_DURATION_S). Short utterances, short replies (16 tokens, about 1.6 s of audio), 8 s
pauses and generous turn timeouts keep the callers' own cost down.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from agent.bench.calls_report import summarise
from agent.bench.level import Plan
from agent.bench.load import run_level
from agent.bench.server import ServerProcess, ServerWatch
from agent.bench.speech import utterance_wavs

pytestmark = pytest.mark.engines

CALLS = int(os.environ.get("OMNIVOX_LOAD_CALLS", "16"))
DURATION_S = float(os.environ.get("OMNIVOX_LOAD_DURATION_S", "60"))
WARM_S = min(60.0, DURATION_S / 2)  # the calls' buffers and codecs are all made by then
UTTERANCES = ("Hello there.", "What time is it?", "Thank you.", "Good morning.",
              "Yes, please.", "Tell me more.")
RSS_TOLERANCE = 0.10


def rss_before(watch: ServerWatch, at: float) -> float:
    """The API process's median RSS (MiB) over the 15 s before `at`."""
    rss = [s.rss / 2**20 for s in watch.between(at - 15.0, at) if s.rss is not None]
    assert rss, f"no RSS sample in the 15 s before {at:.0f}"
    return statistics.median(rss)


def rss_slope(watch: ServerWatch, since: float, until: float) -> float:
    """The API process's RSS trend (MiB per minute) between two times. Taken after the
    warm-up: a leak shows as a steady slope over a long run, buffering under load
    as a bump."""
    samples = [((s.at - since) / 60.0, s.rss / 2**20)
               for s in watch.between(since, until) if s.rss is not None]
    assert len(samples) >= 2, "too few RSS samples after the warm-up"
    minutes, mib = zip(*samples, strict=True)
    return float(np.polyfit(minutes, mib, 1)[0])


def test_calls_held_for_minutes(tiny_models_dir: Path, tmp_path: Path) -> None:
    plan = Plan(url="", concurrency=CALLS, speech=utterance_wavs(UTTERANCES, tmp_path),
                turns=None, duration_s=DURATION_S, pause_s=8.0, barge_in_every=4,
                reply_tokens=16, turn_timeout_s=90.0, connect_timeout_s=90.0)
    log = tmp_path / "server.log"  # kept by pytest: what the server said, when this fails
    with ServerProcess("tiny", models_dir=tiny_models_dir, max_calls=CALLS, log_path=log) as server:
        with ServerWatch(server.url, server.pid, interval_s=1.0) as watch:
            run = run_level(replace(plan, url=server.url), workers=2, watch=watch,
                            progress=False)
        level = summarise(run)
        # The calls first: a run whose calls were refused or whose callers crashed ends early,
        # and its figures below would only say that the warm-up has no samples.
        assert level["calls_connected"] == CALLS, (level["refusals"], f"server log: {log}")
        assert "crashed" not in level, level["crashed"]
        assert level["calls_dropped"] == 0
        warm, end = run.started_at + WARM_S, run.started_at + DURATION_S
        rss1, rss2 = rss_before(watch, warm), rss_before(watch, end)
        slope = rss_slope(watch, warm, end)
        middle = (warm + end) / 2
        halves = (rss_slope(watch, warm, middle), rss_slope(watch, middle, end))
        rss_by_minute = ", ".join(f"{rss_before(watch, run.started_at + 60.0 * m):.1f}"
                                  for m in range(1, int(DURATION_S // 60) + 1))
    srv = level["server"] or {}
    print(f"\n[load] {level['calls_connected']}/{CALLS} calls held for {level['wall_s']:.0f} s, "
          f"{level['calls_dropped']} dropped; turns {level['turns_ok']} ok, "
          f"{level['turns_failed']} failed {level['failures']}; error events "
          f"{level['error_events']}")
    print(f"[load] event loop lag p99: {srv.get('event_loop_lag_p99_ms')} ms over the run, "
          f"{srv.get('event_loop_lag_p99_last_minute_ms')} ms over the last minute "
          f"(target < 50 ms); /healthz round trip {srv.get('healthz_ms')}")
    print(f"[load] API process RSS: at {WARM_S:.0f} s {rss1:.1f} MiB, at the end {rss2:.1f} "
          f"MiB ({(rss2 - rss1) / rss1:+.1%}); slope after {WARM_S:.0f} s {slope:+.2f} MiB/min")
    print(f"[load] RSS by minute (MiB): {rss_by_minute}; slope over the first and the second "
          f"half after {WARM_S:.0f} s: {halves[0]:+.2f}, {halves[1]:+.2f} MiB/min (a leak keeps "
          "its slope, a warm-up flattens)")
    print(f"[load] at the callers: ttfa {level['ttfa_ms']}, barge-in stop "
          f"{level['barge_in_stop_ms']} (the server's cut arrived {level['barge_in_cut_ms']} "
          f"after the onset, the reply heard {level['barge_in_after_cut_ms']} after the cut), "
          f"longest gap {level['gaps_ms_max']} ms, longest late "
          f"arrival {level['late_ms_max']} ms, generator loop lag p99 "
          f"{level['generator_loop_lag_p99_ms']} ms")
    print(f"[load] the turn with the longest gap: {level['longest_gap']}")

    assert level["error_events"] == 0, (level["errors"], f"server log: {log}")
    # Every call was really talking: each had replies that started, completed and played out.
    per_call = {c["call"]: c["turns_ok"] for c in run.calls}
    assert all(n >= 2 for n in per_call.values()), per_call
    assert abs(rss2 - rss1) / rss1 <= RSS_TOLERANCE, (rss1, rss2)
    if DURATION_S >= 300:  # the soak: no steady growth (a leak) over the run after warm-up
        growth = slope * (DURATION_S / 60.0 - 1.0)
        assert growth <= RSS_TOLERANCE * rss1, (rss1, slope, growth)
