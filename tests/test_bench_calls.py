"""`omnivox bench calls` as a user runs it: it starts `omnivox serve --profile tiny` itself (and a
second server with --sequential-stages for `--compare-sequential`, in `make soak`), calls it
from aiortc callers in worker processes at one and two concurrent calls, and writes a table,
JSON whose figures are real measurements, and PNG plots. Also the pieces it stands on that
need no server: the Prometheus histogram reading, the serve option that turns the stage overlap
off, the cached speech."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from agent.bench import check
from agent.bench.call_script import GAP_MS, refusal_reason
from agent.bench.calls_report import report, summarise
from agent.bench.level import Plan
from agent.bench.light_caller import SILENT_MAX_BYTES, PacketCache
from agent.bench.load import run_level
from agent.bench.server import ServerWatch, histogram_quantile, parse_samples
from agent.bench.speech import read_wav, utterance_wavs
from agent.cli import parse_args, pipeline_overrides
from agent.config import Settings
from agent.profiles import pipeline_settings
from media.pacing import PacingLateness
from tests.conftest import wait_idle
from tests.served import Served

PNG = b"\x89PNG\r\n\x1a\n"
TURNS = 3  # a call's turns in the bench runs


@pytest.mark.engines
async def test_light_callers_cost_less_than_full_ones(tiny_server: Served,
                                                      tmp_path: Path) -> None:
    """One short level of full callers and one of light ones (agent/bench/light_caller.py)
    against the shared tiny server: both carry their turns, each level reports what a call
    costs (the server's CPU per call, its pacing lateness, the callers' CPU per call), and a
    light caller costs less CPU than a full one."""
    plan = Plan(url=tiny_server.url, concurrency=2, speech=utterance_wavs(
        ["Hello there.", "Thank you."], tmp_path), turns=2, pause_s=0.3, barge_in_every=0,
        reply_tokens=12)
    levels = {}
    with ServerWatch(tiny_server.url, os.getpid()) as watch:
        for callers in ("full", "light"):
            run = await asyncio.to_thread(run_level, replace(plan, callers=callers), 2, watch,
                                          False)
            levels[callers] = level = summarise(run)
            await wait_idle(tiny_server)
            assert level["calls_connected"] == 2 and level["calls_dropped"] == 0, level
            assert level["turns_ok"] == 4, (callers, level["failures"])
            assert level["ttfa_ms"]["p50"] > level["silence_ms"], level["ttfa_ms"]
            capacity = level["capacity"]
            assert capacity["callers"] == callers
            assert capacity["call_seconds"] > 0, capacity
            assert 0 < capacity["call_plane_cpu_per_call"] < os.cpu_count(), capacity
            assert 0 < capacity["callers_cpu_per_call"] < os.cpu_count(), capacity
            assert capacity["pacing_late_p99_ms"] is not None, capacity
            assert capacity["pacing_late_p99_ms"] >= 0, capacity
    light, full = levels["light"]["capacity"], levels["full"]["capacity"]
    print(f"\ncallers' CPU per call: full {full['callers_cpu_per_call']:.4f}, "
          f"light {light['callers_cpu_per_call']:.4f}")
    assert light["callers_cpu_per_call"] < full["callers_cpu_per_call"], (light, full)
    table = report({"server_label": "the shared tiny server", "levels": [levels["light"]]})
    assert "pace p99" in table and "calls per core of the call plane" in table, table


def bench_calls(models_dir: Path, tmp_path: Path, *options: str) -> tuple[str, dict[str, Any]]:
    """`omnivox bench calls` on tiny, TURNS turns a call, every second one talked over: what it
    printed and the JSON it wrote."""
    out = tmp_path / "calls.json"
    command = [sys.executable, "-m", "agent.cli", "bench", "calls", "--profile", "tiny",
               "--models-dir", str(models_dir), "--turns", str(TURNS), "--barge-in-every", "2",
               "--reply-tokens", "24", "--pause", "0.5", "--speech-dir", str(tmp_path / "speech"),
               "--json", str(out), "--no-progress", *options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


def assert_level(level: dict[str, Any]) -> None:
    """One level's figures are real measurements of its calls, consistent with each other."""
    n = level["concurrency"]
    assert level["calls_connected"] == n and level["calls_dropped"] == 0, level
    assert level["error_events"] == 0, level["errors"]
    assert level["turns_ok"] == TURNS * n and level["turns_failed"] == 0, level["failures"]
    wall_ms = level["wall_s"] * 1000  # every figure below was taken inside the level
    silence = level["silence_ms"]
    assert silence == 500  # the server's turn detection, as session.created said
    ttfa, after_vad = level["ttfa_ms"], level["ttfa_after_vad_ms"]
    samples = level["samples"]["ttfa_ms"]
    assert ttfa["n"] == after_vad["n"] == TURNS * n == len(samples), (ttfa, after_vad)
    # The summary is of these samples; the figure after the VAD is the same less the silence.
    assert ttfa["p50"] == pytest.approx(float(np.median(samples))), (ttfa, samples)
    assert ttfa["max"] == max(samples), (ttfa, samples)
    for key in ("p50", "p95", "max"):
        assert after_vad[key] == pytest.approx(ttfa[key] - silence), (key, ttfa, after_vad)
    # No reply can start before the server's VAD has heard `silence` ms of silence.
    assert silence < min(samples) <= ttfa["p50"] <= ttfa["p95"] <= ttfa["max"] < wall_ms
    # Turn 2 of each call was talked over by turn 3: the server waits for barge_in_min_ms
    # (200 ms) of speech before it cuts, so the reply went on for a while after our onset.
    barge = level["barge_in_stop_ms"]
    assert level["barge_ins_planned"] == n and barge["n"] == n, barge
    assert barge["max"] == max(level["samples"]["barge_in_stop_ms"]), barge
    assert 100 < barge["p50"] <= barge["max"] < wall_ms, barge
    heard = level["barge_in_heard_ms"]  # the server's speech_started, after our onset
    assert heard["n"] == n and 0 < heard["p50"] < barge["p50"], (heard, barge)
    # The stop counted from speech_started is the stop less that: for one or two barge-ins
    # (a median of one or two values is their mean) the medians subtract too.
    after_heard = level["barge_in_stop_after_heard_ms"]
    assert after_heard["p50"] == pytest.approx(barge["p50"] - heard["p50"]), after_heard
    # The cut arrived after speech_started and after the floor's 200 ms of speech had been
    # sent in real time (less a frame or two: the VAD counts from its first voiced frame);
    # the stop is the cut plus what was still heard after it.
    cut, after_cut = level["barge_in_cut_ms"], level["barge_in_after_cut_ms"]
    assert cut["n"] == n and heard["p50"] < cut["p50"] and cut["p50"] > 150, (cut, heard)
    assert after_cut["p50"] == pytest.approx(barge["p50"] - cut["p50"]), after_cut
    # Gaps inside replies: the count of those of GAP_MS or more agrees with the longest.
    assert level["gaps_ms_max"] is not None and level["gaps_ms_max"] < wall_ms, level
    assert (level["gaps"] > 0) == (level["gaps_ms_max"] >= GAP_MS), level
    longest = level["longest_gap"]  # that turn, with the server's underruns in it
    if level["gaps_ms_max"]:
        assert longest["gaps_ms"] == level["gaps_ms_max"], longest
        assert longest["stamps"]["underruns"] >= 0, longest
    else:
        assert longest is None, longest
    assert level["late_ms_max"] is not None and level["late_ms_max"] < wall_ms, level
    # Turns per second: over the time until the last reply ended, which is within the
    # level and at least as long as the slowest turn's first audio took.
    assert level["turns_ok"] / level["wall_s"] <= level["turns_per_s"], level
    assert level["turns_per_s"] <= level["turns_ok"] / (ttfa["max"] / 1000), level
    assert level["rtp_misses"] == 0
    server = level["server"]
    rss = server["rss_mb"]  # the API process, sampled while the calls ran
    assert rss["max"] > 50 and rss["first"] <= rss["max"] and rss["last"] <= rss["max"], rss
    cores = server["cpu_cores"]  # CPU time over the level's wall time: within the machine
    assert cores["api"] > 0 and cores["stages"] > 0, cores
    assert cores["api"] + cores["stages"] <= (os.cpu_count() or 1) + 0.05, cores
    assert server["healthz_unanswered"] == 0
    # The server (started here) has /metrics: its own figures for the level agree.
    assert server["metrics"], server
    assert server["event_loop_lag_p99_ms"] is not None and server["event_loop_lag_p99_ms"] > 0
    assert server["calls_dropped"] == 0 and server["calls_refused"] == 0, server
    assert server["server_ttfa_p50_ms"] is not None, server


@pytest.mark.engines
def test_bench_calls_command(tiny_models_dir: Path, tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    stdout, result = bench_calls(tiny_models_dir, tmp_path, "--concurrency", "1,2",
                                 "--plots", str(plots))
    assert "ttfa p50" in stdout
    assert "target (tiny): time to first audio p50 < 150 ms" in stdout
    assert [level["concurrency"] for level in result["levels"]] == [1, 2]
    for level in result["levels"]:
        assert_level(level)
    assert result["sequential"] is None and result["cascade_vs_sequential"] is None
    # `bench check` reads its 1-call figures out of this same JSON, each one there.
    one_call = check.read_figures(check.Run("calls", (), check.calls_figures(1)), result)
    level = result["levels"][0]
    assert one_call["calls: 1 call: first audio after the end-of-turn silence p50 ms"][
        "value"] == pytest.approx(level["ttfa_after_vad_ms"]["p50"], abs=1e-3)
    assert one_call["calls: 1 call: gaps in replies"]["value"] == level["gaps"]
    assert all(figure["value"] is not None for figure in one_call.values()), one_call
    assert sorted(p.name for p in plots.iterdir()) == ["capacity.png", "latency_cdf.png"]
    for png in plots.iterdir():
        assert png.read_bytes().startswith(PNG) and png.stat().st_size > 10_000


@pytest.mark.engines
@pytest.mark.skipif(not os.environ.get("OMNIVOX_BENCH_SEQUENTIAL"),
                    reason="a second server (sequential stages, 40-60 s to start) for one bench "
                           "option: set OMNIVOX_BENCH_SEQUENTIAL (make soak)")
def test_bench_calls_compares_the_cascade_with_sequential_stages(tiny_models_dir: Path,
                                                                 tmp_path: Path) -> None:
    stdout, result = bench_calls(tiny_models_dir, tmp_path, "--concurrency", "1",
                                 "--compare-sequential")
    assert "cascade vs sequential stages at 1 call(s)" in stdout
    for level in [*result["levels"], result["sequential"]]:
        assert_level(level)
    ratio = result["cascade_vs_sequential"]
    assert ratio["concurrency"] == 1
    assert ratio["cascade_ms"] == result["levels"][0]["ttfa_after_vad_ms"]["p50"], ratio
    assert ratio["sequential_ms"] == result["sequential"]["ttfa_after_vad_ms"]["p50"], ratio
    assert ratio["ratio"] == pytest.approx(ratio["sequential_ms"] / ratio["cascade_ms"])


def test_bad_concurrency_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0,4", "one", ""):
        with pytest.raises(SystemExit):
            parse_args(["bench", "calls", "--concurrency", bad])
        assert "--concurrency" in capsys.readouterr().err


def test_sequential_stages_keep_the_profiles_cascade() -> None:
    """`serve --sequential-stages` turns the overlap off and nothing else of the profile."""
    args = parse_args(["serve", "--profile", "local", "--sequential-stages"])
    settings = pipeline_settings(Settings(profile="local"), pipeline_overrides(args))
    default = pipeline_settings(Settings(profile="local"))
    assert default.cascade.overlap and not settings.cascade.overlap
    assert settings.cascade.chunk_growth == default.cascade.chunk_growth == 1.5
    assert pipeline_overrides(parse_args(["serve", "--profile", "local"])) == {}


def test_refusals_are_counted_by_the_check_that_refused() -> None:
    """Two offers refused by the loop-lag check with different figures count as one reason,
    apart from the pacing check's and from a bare status."""
    def refused(status: int, body: object) -> Exception:
        request = httpx.Request("POST", "http://127.0.0.1/v1/realtime/calls")
        response = httpx.Response(status, json=body, request=request)
        return httpx.HTTPStatusError("refused", request=request, response=response)

    def busy(message: str) -> Exception:
        return refused(503, {"error": {"code": "server_busy", "message": message}})

    lag = [refusal_reason(busy(f"server busy: the event loop ran {ms} ms late in the last 5 s "
                                   "(limit 100 ms)")) for ms in (143, 2410)]
    pacing = refusal_reason(busy("server busy: the calls' audio frames left up to 61 ms late "
                                 "(p99) in the last 5 s (limit 50 ms)"))
    assert lag[0] == lag[1] == ("HTTP 503 server_busy: server busy: the event loop ran N ms "
                                "late in the last N s (limit N ms)")
    assert pacing != lag[0] and pacing.startswith("HTTP 503 server_busy: ")
    assert refusal_reason(refused(502, ["not", "an", "error"])) == "HTTP 502"
    assert refusal_reason(TimeoutError("no answer")) == "TimeoutError: no answer"


def test_histogram_quantile_between_two_scrapes() -> None:
    registry = CollectorRegistry()
    lag = Histogram("omnivox_event_loop_lag_seconds", "lag", buckets=(0.01, 0.05, 0.1, 1.0),
                    registry=registry)
    for _ in range(50):
        lag.observe(0.5)  # before the level: must not count
    before = parse_samples(generate_latest(registry).decode())
    for value in [0.001] * 90 + [0.07] * 10:
        lag.observe(value)
    after = parse_samples(generate_latest(registry).decode())
    name = "omnivox_event_loop_lag_seconds"
    assert histogram_quantile(0.5, before, after, name) == pytest.approx(0.01 * 50 / 90)
    # The 99th of 100 lies in (0.05, 0.1], 9 of its 10 ranks in: interpolated as Prometheus does.
    assert histogram_quantile(0.99, before, after, name) == pytest.approx(0.05 + 0.05 * 0.9)
    assert histogram_quantile(0.99, after, after, name) is None  # nothing observed between


def test_utterances_are_cached_trimmed_16k(tmp_path: Path) -> None:
    first = utterance_wavs(["Hello there."], tmp_path)
    pcm, rate = read_wav(first[0])
    assert rate == 16_000 and 0.3 < len(pcm) / rate < 2.0
    # Trimmed: it starts and ends with sound, not with espeak-ng's padding.
    edge = rate // 100
    assert np.abs(pcm[:edge]).max() > 30 and np.abs(pcm[-edge:]).max() > 30
    stamp = Path(first[0]).stat().st_mtime_ns
    assert utterance_wavs(["Hello there."], tmp_path) == first
    assert Path(first[0]).stat().st_mtime_ns == stamp  # made once


def test_light_callers_packets_tell_silence_from_speech(tmp_path: Path) -> None:
    """An utterance is one Opus packet per 20 ms (its last frame padded), encoded once; digital
    silence codes small enough for a light caller to tell it from speech by size alone."""
    pcm, rate = read_wav(utterance_wavs(["Hello there."], tmp_path)[0])
    cache = PacketCache()
    packets = cache.packets(pcm)
    assert len(packets) == -(-len(pcm) // (rate // 50))
    assert cache.packets(pcm) is packets  # made once
    assert len(cache.silence) <= SILENT_MAX_BYTES
    loud = sum(len(p) > SILENT_MAX_BYTES for p in packets)
    assert loud >= 0.9 * len(packets), [len(p) for p in packets]


def test_pacing_lateness_recent_p99() -> None:
    lateness = PacingLateness()
    for _ in range(99):
        lateness.observe(0.004, now=100.0)  # on time
    lateness.observe(0.3, now=100.0)
    assert lateness.recent_quantile(0.99, 5.0, now=101.0) == 0.005
    lateness.observe(0.3, now=101.0)  # 2 of 101 late: the p99 is late
    assert lateness.recent_quantile(0.99, 5.0, now=101.0) == 0.5
    assert lateness.recent_quantile(0.99, 5.0, now=110.0) == 0.0  # the window moved on
    assert sum(lateness.counts) == 101 and lateness.total_s == pytest.approx(0.996)


def test_bench_check_flags_a_figure_over_a_quarter_worse() -> None:
    recorded = {"a": {"value": 100.0}, "b": {"value": 10.0}, "c": {"value": 0.0},
                "d": {"value": 50.0}}
    figures = {"a": {"value": 124.0, "higher_is_better": False},  # within 25%
               "b": {"value": 7.0, "higher_is_better": True},  # 30% fewer turns/s
               "c": {"value": 1.0, "higher_is_better": False},  # a gap where none was
               "d": {"value": None, "higher_is_better": False},  # not measured this run
               "e": {"value": 3.0, "higher_is_better": False}}  # no baseline yet
    rows = {row["figure"]: row for row in check.compare(figures, recorded)}
    assert [name for name, row in rows.items() if row["worse"]] == ["b", "c"]
    assert rows["a"]["ratio"] == pytest.approx(1.24) and rows["e"]["ratio"] is None
    assert check.worse(126.0, 100.0, higher_is_better=False)
