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

Per level, what a call costs (agent/bench/capacity.py): the call plane's CPU per call, the
callers' own, the server's pacing lateness p99, and calls per core while that stays under 20 ms.
`--callers light` (agent/bench/light_caller.py) makes the callers far cheaper than the server.

`--turn-detection semantic_vad --eagerness high` (or server_vad) has every caller ask for it
in a session.update once connected; the time to first audio is still counted from the end of
speech. Each turn also carries the server's stamps of it (agent/bench/turn_stamps.py): where
its time to first audio went.

Levels of concurrency run one after the other on the same server; `--compare-sequential` also
runs the first level on a server whose stages run one after the other (no overlap).
`--call-workers 1,2` runs the levels against a server started with each number of call
workers and reports the calls each carried on time, and the ratio (agent/bench/scaling.py).
`--call-plane-cpus 1` runs the started server's call plane alone on one CPU, everything else
on the others (agent/bench/pinning.py), so its pacing is the call plane's own.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from agent.bench.calls_report import FIRST_AUDIO_TARGETS, TARGETS, report, summarise
from agent.bench.capacity import best_calls_per_core
from agent.bench.level import Plan
from agent.bench.load import run_level
from agent.bench.pinning import pin_server, split_cpus
from agent.bench.scaling import scaling, scaling_table
from agent.bench.server import ServerProcess, ServerWatch, wait_calls_ended
from agent.bench.speech import default_speech_dir, utterance_wavs
from agent.bench.turn import QUESTIONS


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
    callers: str = "full"  # full or light (agent/bench/light_caller.py)
    turn_detection: str | None = None  # server_vad or semantic_vad; None: the server's
    eagerness: str | None = None  # semantic_vad's
    api_key: str | None = None
    compare_sequential: bool = False
    sequential_url: str | None = None
    speech_dir: Path | None = None
    json_path: Path | None = None
    plots_dir: Path | None = None
    progress: bool = True
    call_workers: list[int] | None = None  # servers started with each count (scaling)
    call_plane_cpus: int | None = None  # the started server's call plane on CPUs of its own


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
                codec=options.codec, api_key=options.api_key, callers=options.callers,
                turn_detection=options.turn_detection, eagerness=options.eagerness)

    pinned = None
    if options.call_plane_cpus is not None:
        if options.url is not None:
            raise ValueError("--call-plane-cpus pins the server it starts: it takes no --url")
        pinned = split_cpus(options.call_plane_cpus)
        os.sched_setaffinity(0, pinned[1])  # the bench, its callers and servers: off the plane

    def sweep(url: str, pid: int | None, levels: list[int]) -> list[dict[str, Any]]:
        out = []
        with ServerWatch(url, pid, headers=headers) as watch:
            for n in levels:
                wait_calls_ended(url, headers=headers)
                if pinned is not None and pid is not None:
                    pin_server(pid, *pinned)
                run = run_level(replace(base, url=url, concurrency=n), workers, watch,
                                options.progress)
                out.append(summarise(run))
        return out

    result: dict[str, Any] = {"profile": None if options.url else options.profile,
                              "url": options.url, "plan": {
                                  k: v for k, v in asdict(base).items()
                                  if k not in ("url", "concurrency", "speech", "api_key")},
                              "workers": workers, "sequential": None,
                              "targets": {**TARGETS, "first_audio_p50_ms": [
                                  target._asdict()
                                  for target in FIRST_AUDIO_TARGETS.get(options.profile, ())]},
                              "cascade_vs_sequential": None}
    result["calls_per_core"] = None
    result["call_plane_cpus"] = sorted(pinned[0]) if pinned else None
    top = max(options.concurrency)
    if options.call_workers:
        if options.url is not None:
            raise ValueError("--call-workers starts its servers: it takes no --url")
        runs: dict[int, list[dict[str, Any]]] = {}
        for count in options.call_workers:
            with ServerProcess(options.profile, models_dir=options.models_dir, max_calls=top,
                               extra_args=("--call-workers", str(count))) as server:
                runs[count] = sweep(server.url, server.pid, options.concurrency)
        result["server_label"] = (f"`omnivox serve --profile {options.profile} --call-workers "
                                  f"{options.call_workers[0]}` (started here)")
        result["levels"] = runs[options.call_workers[0]]
        result["call_workers"] = {str(n): levels for n, levels in runs.items()}
        result["scaling"] = scaling(runs)
    elif options.url is not None:
        result["server_label"] = f"the server at {options.url}"
        result["levels"] = sweep(options.url, None, options.concurrency)
    else:
        result["server_label"] = f"`omnivox serve --profile {options.profile}` (started here)"
        with ServerProcess(options.profile, models_dir=options.models_dir,
                           max_calls=top) as server:
            result["levels"] = sweep(server.url, server.pid, options.concurrency)
    result["calls_per_core"] = best_calls_per_core(result["levels"])
    if pinned:
        result["server_label"] += (f", its call plane alone on CPU(s) "
                                   f"{', '.join(map(str, sorted(pinned[0])))}")
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
    if result.get("scaling"):
        print(scaling_table(result))
    if options.json_path is not None:
        options.json_path.parent.mkdir(parents=True, exist_ok=True)
        options.json_path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"omnivox bench: results written to {options.json_path}")
    if result.get("plots"):
        print(f"omnivox bench: plots written to {', '.join(result['plots'])}")
    failed = any(level["turns_ok"] == 0 for level in result["levels"])
    return 1 if failed else 0
