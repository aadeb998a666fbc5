"""The `omnivox` command line: serve, build models, run benchmarks."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from agent.config import Settings

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="omnivox", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the voice-agent server (one async worker)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--profile", default="local", help="model profile (agent/profiles.toml)")
    serve.add_argument("--models-dir", type=Path, default=None, help="default: ./models")
    serve.add_argument("--log-level", default="info")

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
    return parser.parse_args(argv)


def models_dir(args: argparse.Namespace) -> dict[str, Path]:
    """The --models-dir given, else OMNIVOX_MODELS_DIR, else the settings' default."""
    chosen = args.models_dir or os.environ.get("OMNIVOX_MODELS_DIR")
    return {"models_dir": Path(chosen)} if chosen else {}


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from agent.app import create_app
    from agent.profiles import build_pipeline

    settings = Settings(host=args.host, port=args.port, profile=args.profile,
                        **models_dir(args))
    app = create_app(settings, pipeline=build_pipeline(settings))
    print(f"omnivox: serving profile {settings.profile!r} at http://{args.host}:{args.port}/")
    # uvicorn stops gracefully on SIGTERM (calls closed, workers stopped), then re-raises the
    # signal to whatever handler was there before it: ours makes that stop a clean exit 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    # One worker on purpose: the engines live once per host, behind this process.
    uvicorn.run(app, host=args.host, port=args.port, workers=1, log_level=args.log_level)
    return 0


def build_models(args: argparse.Namespace) -> int:
    from pipeline.models import build_family

    directory = Settings(**models_dir(args)).models_dir
    build_family(args.family, str(directory))
    print(f"omnivox: {args.family} models ready in {directory / args.family}")
    return 0


def bench_pipeline(args: argparse.Namespace) -> int:
    from agent.bench_report import print_pipeline_report, write_json
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
    from agent.bench_turn import run

    if args.turns < 1:
        raise SystemExit("omnivox bench turn: --turns must be at least 1")
    settings = Settings(profile=args.profile, **models_dir(args))
    return run(settings, args.url, args.turns, args.json_path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    level = getattr(args, "log_level", "info").upper()
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)
    if args.command == "serve":
        return serve(args)
    if args.command == "models":
        return build_models(args)
    if args.command == "bench" and args.bench_command == "pipeline":
        return bench_pipeline(args)
    if args.command == "bench" and args.bench_command == "turn":
        return bench_turn(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
