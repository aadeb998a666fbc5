"""The `omnivox` command line: serve, build models, run benchmarks."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from agent.config import Settings
from agent.ops import logs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="omnivox", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the voice-agent server (one async worker)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--profile", default="local", help="model profile (agent/profiles.toml)")
    serve.add_argument("--models-dir", type=Path, default=None, help="default: ./models")
    serve.add_argument("--data-dir", type=Path, default=None,
                       help="call records (SQLite); default: ./data, or OMNIVOX_DATA_DIR")
    serve.add_argument("--max-calls", type=int, default=None,
                       help="concurrent calls taken before 503 (default: 16)")
    serve.add_argument("--sequential-stages", action="store_true",
                       help="run the stages one after the other, no overlap (for benchmarks)")
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--log-format", choices=logs.FORMATS, default=None,
                       help=f"text (default) or json, one object per line; or {logs.FORMAT_ENV}")

    models = commands.add_parser("models", help="build or inspect model families")
    models_cmd = models.add_subparsers(dest="models_command", required=True)
    build = models_cmd.add_parser("build", help="build a family's models locally")
    build.add_argument("family")
    build.add_argument("--models-dir", type=Path, default=None, help="default: ./models")

    bench = commands.add_parser("bench", help="measure (figures printed and written as JSON)")
    bench_cmd = bench.add_subparsers(dest="bench_command", required=True)
    pipe = bench_cmd.add_parser("pipeline", help="shm vs pickle, cascade vs sequential, turns/s")
    pipe.add_argument("--profile", default="tiny")
    pipe.add_argument("--models-dir", type=Path, default=None, help="default: ./models")
    pipe.add_argument("--tokens", type=int, default=100, help="reply length for first audio")
    pipe.add_argument("--json", dest="json_path", help="also write the figures here")
    turn = bench_cmd.add_parser("turn", help="per-stage latency of spoken turns, real calls")
    turn.add_argument("--profile", default="tiny", help="the profile served in this process")
    turn.add_argument("--url", help="bench a running server instead (caller-side figures only)")
    turn.add_argument("--turns", type=int, default=10, help="questions asked in one call")
    turn.add_argument("--json", dest="json_path", type=Path, help="also write the figures here")
    turn.add_argument("--models-dir", type=Path, default=None, help="default: ./models")
    turn.add_argument("--log-level", default="warning")
    add_bench_calls(bench_cmd)
    return parser.parse_args(argv)


def add_bench_calls(bench_cmd: Any) -> None:
    calls = bench_cmd.add_parser(
        "calls", help="time to first audio, barge-in and capacity over concurrent real calls")
    calls.add_argument("--url", help="bench a running server (default: start one, --profile)")
    calls.add_argument("--profile", default="tiny", help="the profile of the server started")
    calls.add_argument("--models-dir", type=Path, default=None, help="default: ./models")
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
    calls.add_argument("--api-key", default=os.environ.get("OMNIVOX_API_KEY"),
                       help="Bearer key for a server with API keys (or OMNIVOX_API_KEY)")
    calls.add_argument("--compare-sequential", action="store_true",
                       help="also run the lowest level on a server whose stages do not overlap")
    calls.add_argument("--sequential-url",
                       help="with --url: that server, started with --sequential-stages")
    calls.add_argument("--speech-dir", type=Path, default=None,
                       help="cache of the spoken utterances (default: ~/.cache/omnivox)")
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


def models_dir(args: argparse.Namespace) -> dict[str, Path]:
    """The --models-dir given, else OMNIVOX_MODELS_DIR, else the settings' default."""
    chosen = args.models_dir or os.environ.get("OMNIVOX_MODELS_DIR")
    return {"models_dir": Path(chosen)} if chosen else {}


def data_dir(args: argparse.Namespace) -> dict[str, Path]:
    """The --data-dir given, else OMNIVOX_DATA_DIR, else the settings' default."""
    chosen = args.data_dir or os.environ.get("OMNIVOX_DATA_DIR")
    return {"data_dir": Path(chosen)} if chosen else {}


def pipeline_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """What `serve` changes in the profile's pipeline settings: with --sequential-stages, the
    profile's cascade settings with overlap off (each stage runs to its end before the next)."""
    if not args.sequential_stages:
        return {}
    from agent.profiles import load_profiles

    cascade = dict(load_profiles().get(args.profile, {}).get("cascade", {}))
    return {"cascade": {**cascade, "overlap": False}}


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from agent.api.auth import env_settings
    from agent.app import create_app
    from agent.calls.limits import env_limits
    from agent.profiles import build_pipeline

    limits = env_limits(os.environ)  # OMNIVOX_MAX_CALL_S etc.; --max-calls wins over the env
    if args.max_calls is not None:
        limits["max_calls"] = args.max_calls
    settings = Settings(host=args.host, port=args.port, profile=args.profile,
                        **models_dir(args), **data_dir(args), **limits,
                        **env_settings(os.environ))
    app = create_app(settings, pipeline=build_pipeline(settings, pipeline_overrides(args)))
    print(f"omnivox: serving profile {settings.profile!r} at http://{args.host}:{args.port}/")
    # uvicorn stops gracefully on SIGTERM (calls closed, workers stopped), then re-raises the
    # signal to whatever handler was there before it: ours makes that stop a clean exit 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    # One worker on purpose: the engines live once per host, behind this process.
    # log_config=None: uvicorn's records go through our handler, in the chosen format.
    uvicorn.run(app, host=args.host, port=args.port, workers=1, log_level=args.log_level,
                log_config=None)
    return 0


def build_models(args: argparse.Namespace) -> int:
    from pipeline.models import build_family

    directory = Settings(**models_dir(args)).models_dir
    build_family(args.family, str(directory))
    print(f"omnivox: {args.family} models ready in {directory / args.family}")
    return 0


def bench_pipeline(args: argparse.Namespace) -> int:
    from agent.bench.report import print_pipeline_report, write_json
    from agent.profiles import pipeline_settings
    from pipeline.bench import run_bench

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # the figures, not engine chatter
    settings = pipeline_settings(Settings(profile=args.profile, **models_dir(args)))
    result = run_bench(settings, tokens=args.tokens)
    result["profile"] = args.profile
    print_pipeline_report(result)
    if args.json_path:
        write_json(args.json_path, result)
    return 0


def bench_turn(args: argparse.Namespace) -> int:
    from agent.bench.turn import run

    if args.turns < 1:
        raise SystemExit("omnivox bench turn: --turns must be at least 1")
    settings = Settings(profile=args.profile, **models_dir(args))
    return run(settings, args.url, args.turns, args.json_path)


def bench_calls(args: argparse.Namespace) -> int:
    from agent.bench.calls import Options, run

    turns = None if args.duration is not None else args.turns
    if turns is not None and turns < 1:
        raise SystemExit("omnivox bench calls: --turns must be at least 1")
    if args.duration is not None and args.duration <= 0:
        raise SystemExit("omnivox bench calls: --duration must be positive")
    if args.barge_in_every < 0 or args.barge_in_every == 1:
        raise SystemExit("omnivox bench calls: --barge-in-every must be 0 or at least 2")
    if args.sequential_url and not args.url:
        raise SystemExit("omnivox bench calls: --sequential-url goes with --url")
    if args.url and args.compare_sequential and not args.sequential_url:
        raise SystemExit("omnivox bench calls: --compare-sequential with --url needs "
                         "--sequential-url (a server started with --sequential-stages)")
    chosen = args.models_dir or os.environ.get("OMNIVOX_MODELS_DIR")
    return run(Options(
        concurrency=args.concurrency, turns=turns, duration_s=args.duration, url=args.url,
        profile=args.profile, models_dir=Path(chosen) if chosen else None,
        workers=args.workers, pause_s=args.pause, barge_in_every=args.barge_in_every,
        reply_tokens=args.reply_tokens, codec=args.codec, api_key=args.api_key,
        compare_sequential=args.compare_sequential, sequential_url=args.sequential_url,
        speech_dir=args.speech_dir, json_path=args.json_path, plots_dir=args.plots_dir,
        progress=not args.no_progress))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        logs.configure(getattr(args, "log_level", "info"), getattr(args, "log_format", None))
    except ValueError as exc:  # a bad OMNIVOX_LOG_FORMAT
        raise SystemExit(f"omnivox: {exc}") from None
    if args.command == "serve":
        return serve(args)
    if args.command == "models":
        return build_models(args)
    if args.command == "bench" and args.bench_command == "pipeline":
        return bench_pipeline(args)
    if args.command == "bench" and args.bench_command == "turn":
        return bench_turn(args)
    if args.command == "bench" and args.bench_command == "calls":
        return bench_calls(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
