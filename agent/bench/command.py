"""`omnivox bench`: the benchmarks' flags and what each runs. `pipeline`, `turn` and `calls`
are declared here; the others' modules declare their own flags (`add_parser`) and run them
(`command`), imported when the command line is read."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from agent.config import Settings, add_api_key_option, add_setting_flags
from pipeline import environment

# The benchmarks whose module has its own `add_parser(bench_cmd)` and `command(args, settings)`.
MODULE_BENCHES = {
    "asr": "agent.bench.asr_run",
    "gpu": "agent.bench.gpu",
    "gpu-torch": "agent.bench.gpu_torch",
    "answers": "agent.bench.answers",
    "turn-ends": "agent.bench.turn_ends",
    "rtp": "agent.bench.rtp",
    "check": "agent.bench.check",
}


class BenchUsageError(ValueError):
    """Flags a benchmark cannot run with (the message names them)."""


def add_parser(commands: Any) -> None:
    """`omnivox bench` and each benchmark's flags."""
    bench = commands.add_parser("bench", help="measure (figures printed and written as JSON)")
    bench_cmd = bench.add_subparsers(dest="bench_command", required=True)
    pipe = bench_cmd.add_parser("pipeline", help="shm vs pickle, cascade vs sequential, turns/s")
    pipe.add_argument("--profile", default="tiny")
    add_setting_flags(pipe, ("models_dir",))
    pipe.add_argument("--tokens", type=int, default=100, help="reply length for first audio")
    pipe.add_argument("--json", dest="json_path", help="also write the figures here")
    turn = bench_cmd.add_parser("turn", help="per-stage latency of spoken turns, real calls")
    turn.add_argument("--profile", default="tiny", help="the profile served in this process")
    turn.add_argument("--url", help="bench a running server instead (caller-side figures only)")
    turn.add_argument("--turns", type=int, default=10, help="questions asked in one call")
    turn.add_argument("--json", dest="json_path", type=Path, help="also write the figures here")
    add_setting_flags(turn, ("models_dir",))
    turn.add_argument("--log-level", default="warning")
    add_calls_parser(bench_cmd)
    for module in MODULE_BENCHES.values():
        importlib.import_module(module).add_parser(bench_cmd)


def add_calls_parser(bench_cmd: Any) -> None:
    calls = bench_cmd.add_parser(
        "calls", help="time to first audio, barge-in and capacity over concurrent real calls")
    calls.add_argument("--url", help="bench a running server (default: start one, --profile)")
    calls.add_argument("--profile", default="tiny", help="the profile of the server started")
    add_setting_flags(calls, ("models_dir",))
    calls.add_argument("--concurrency", type=concurrency_levels, default=[1, 4, 16],
                       help="comma-separated levels of concurrent calls, run in turn "
                       "(default: 1,4,16)")
    calls.add_argument("--turns", type=int, default=5, help="utterances per call (default: 5)")
    calls.add_argument("--duration", type=float, default=None,
                       help="instead of --turns: keep each call talking this many seconds")
    calls.add_argument("--workers", type=int, default=None,
                       help="caller processes (default: one per CPU core)")
    calls.add_argument("--pause", type=float, default=1.0,
                       help="seconds a caller waits after a reply before speaking again")
    calls.add_argument("--barge-in-every", type=int, default=3,
                       help="talk over every n-th reply (0: never; default: 3)")
    calls.add_argument("--reply-tokens", type=int, default=None,
                       help="max_output_tokens asked of each call (default: the server's)")
    calls.add_argument("--codec", choices=("opus", "PCMU", "PCMA"), default=None,
                       help="offer only this codec (default: all, the server picks Opus)")
    calls.add_argument("--callers", choices=("full", "light"), default="full",
                       help="light: callers send Opus packets encoded once and hear replies "
                       "from packet sizes, so they cost far less CPU than the server "
                       "(default: full, aiortc's encoder and decoder)")
    add_api_key_option(calls)
    calls.add_argument("--turn-detection", choices=("server_vad", "semantic_vad"), default=None,
                       help="the callers' session.update turn_detection.type (default: the "
                       "server's, server_vad with a 500 ms silence)")
    calls.add_argument("--eagerness", choices=("low", "medium", "high", "auto"), default=None,
                       help="semantic_vad's eagerness (default: auto)")
    calls.add_argument("--compare-sequential", action="store_true",
                       help="also run the lowest level on a server whose stages do not overlap")
    calls.add_argument("--sequential-url",
                       help="with --url: that server, started with --sequential-stages")
    calls.add_argument("--speech-dir", type=Path, default=None,
                       help="cache of the spoken utterances (default: ~/.cache/omnivox)")
    calls.add_argument("--call-workers", type=concurrency_levels, default=None,
                       dest="bench_call_workers", metavar="N,M",
                       help="start a server with each number of call workers, run the levels "
                       "on each, report the calls carried on time and the ratio")
    calls.add_argument("--call-plane-cpus", type=int, default=None, metavar="K",
                       help="run the started server's call plane (its API process and call "
                       "workers) alone on K CPUs, and its engines, the bench and the callers "
                       "on the others (agent/bench/pinning.py)")
    calls.add_argument("--json", dest="json_path", type=Path, help="also write the figures here")
    calls.add_argument("--plots", dest="plots_dir", type=Path, help="write PNG plots here")
    calls.add_argument("--no-progress", action="store_true", help="no progress bar")
    calls.add_argument("--log-level", default="warning")


def concurrency_levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"levels must be whole numbers >= 1: {text!r}")
    return levels


def run(args: argparse.Namespace, settings: Settings) -> int:
    """The benchmark `args` name, run; BenchUsageError for flags it cannot run with."""
    module = MODULE_BENCHES.get(args.bench_command)
    if module is not None:
        return int(importlib.import_module(module).command(args, settings))
    return BENCHES[args.bench_command](args, settings)


def bench_pipeline(args: argparse.Namespace, settings: Settings) -> int:
    from agent.bench.pipeline_turns import run_bench
    from agent.bench.report import print_pipeline_report, write_json
    from agent.profiles import pipeline_settings

    environment.set_default("VLLM_LOGGING_LEVEL")  # the figures, not engine chatter
    result = run_bench(pipeline_settings(settings), tokens=args.tokens)
    result["profile"] = settings.profile
    print_pipeline_report(result)
    if args.json_path:
        write_json(args.json_path, result)
    return 0


def bench_turn(args: argparse.Namespace, settings: Settings) -> int:
    from agent.bench.turn import run as run_turns

    if args.turns < 1:
        raise BenchUsageError("bench turn: --turns must be at least 1")
    return run_turns(settings, args.url, args.turns, args.json_path)


def bench_calls(args: argparse.Namespace, settings: Settings) -> int:
    from agent.bench.calls import Options
    from agent.bench.calls import run as run_calls

    turns = None if args.duration is not None else args.turns
    if turns is not None and turns < 1:
        raise BenchUsageError("bench calls: --turns must be at least 1")
    if args.duration is not None and args.duration <= 0:
        raise BenchUsageError("bench calls: --duration must be positive")
    if args.barge_in_every < 0 or args.barge_in_every == 1:
        raise BenchUsageError("bench calls: --barge-in-every must be 0 or at least 2")
    if args.sequential_url and not args.url:
        raise BenchUsageError("bench calls: --sequential-url goes with --url")
    if args.bench_call_workers and args.url:
        raise BenchUsageError("bench calls: --call-workers starts its own servers, no --url")
    if args.call_plane_cpus is not None:
        if args.url:
            raise BenchUsageError("bench calls: --call-plane-cpus pins the server it starts, "
                                  "no --url")
        from agent.bench.pinning import split_cpus

        try:
            split_cpus(args.call_plane_cpus)
        except ValueError as exc:
            raise BenchUsageError(f"bench calls: {exc}") from None
    if args.eagerness and args.turn_detection != "semantic_vad":
        raise BenchUsageError("bench calls: --eagerness goes with --turn-detection semantic_vad")
    if args.url and args.compare_sequential and not args.sequential_url:
        raise BenchUsageError("bench calls: --compare-sequential with --url needs "
                              "--sequential-url (a server started with --sequential-stages)")
    return run_calls(Options(
        concurrency=args.concurrency, turns=turns, duration_s=args.duration, url=args.url,
        profile=settings.profile, models_dir=settings.models_dir,
        workers=args.workers, pause_s=args.pause, barge_in_every=args.barge_in_every,
        reply_tokens=args.reply_tokens, codec=args.codec, api_key=args.api_key,
        callers=args.callers, turn_detection=args.turn_detection, eagerness=args.eagerness,
        compare_sequential=args.compare_sequential,
        sequential_url=args.sequential_url,
        speech_dir=args.speech_dir, json_path=args.json_path, plots_dir=args.plots_dir,
        progress=not args.no_progress, call_workers=args.bench_call_workers,
        call_plane_cpus=args.call_plane_cpus))


BENCHES = {"pipeline": bench_pipeline, "turn": bench_turn, "calls": bench_calls}
