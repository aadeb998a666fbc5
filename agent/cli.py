"""The `omnivox` command line: serve, build models, run benchmarks."""

from __future__ import annotations

import argparse
import logging
import sys

from agent.config import Settings

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="omnivox", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the voice-agent server (one async worker)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--profile", default="tiny", help="model profile (see agent/profiles.toml)")
    serve.add_argument("--log-level", default="info")

    models = commands.add_parser("models", help="build or inspect model families")
    models_cmd = models.add_subparsers(dest="models_command", required=True)
    build = models_cmd.add_parser("build", help="build a family's models locally")
    build.add_argument("family")
    return parser.parse_args(argv)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from agent.app import create_app
    from agent.profiles import build_pipeline

    settings = Settings(host=args.host, port=args.port, profile=args.profile)
    app = create_app(settings, pipeline=build_pipeline(settings))
    print(f"omnivox: serving profile {settings.profile!r} at http://{args.host}:{args.port}/")
    # One worker on purpose: the engines live once per host, behind this process.
    uvicorn.run(app, host=args.host, port=args.port, workers=1, log_level=args.log_level)
    return 0


def build_models(args: argparse.Namespace) -> int:
    from pipeline.models import build_family

    models_dir = Settings().models_dir
    build_family(args.family, str(models_dir))
    print(f"omnivox: {args.family} models ready in {models_dir / args.family}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    level = getattr(args, "log_level", "info").upper()
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)
    if args.command == "serve":
        return serve(args)
    if args.command == "models":
        return build_models(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
