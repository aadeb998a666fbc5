"""The `omnivox` command line: serve, build models, run benchmarks."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent.config import REPO_ROOT, Settings, env_name
from agent.ops import logs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="omnivox", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the voice-agent server (one async worker)")
    add_setting_flags(serve, SERVE_FLAGS)
    serve.add_argument("--sequential-stages", action="store_true",
                       help="run the stages one after the other, no overlap (for benchmarks)")

    worker = commands.add_parser(
        "call-worker", help="one call-worker process (`serve --call-workers N` starts them)")
    worker.add_argument("--socket", required=True, help="the unix socket to serve on")
    worker.add_argument("--settings-file", type=Path, required=True,
                        help="the front's settings, as JSON")
    worker.add_argument("--owner", type=int, required=True, help="its pool owner tag")
    worker.add_argument("--index", type=int, default=0, help="its number, for the logs")

    models = commands.add_parser("models", help="build or inspect model families")
    models_cmd = models.add_subparsers(dest="models_command", required=True)
    build = models_cmd.add_parser("build", help="build a family's models locally")
    build.add_argument("family", help="a model family, or a profile (its family is built)")
    build.add_argument("--version", default="1", type=model_version,
                       help="the model version built (default: 1, the models dir itself; N > 1 "
                       "in <models-dir>/versions/N)")
    build.add_argument("--seed", type=int, default=None,
                       help="the seed of a random-weight family's weights (default: its own)")
    build.add_argument("--output-schema", type=Path, default=None, metavar="FILE",
                       help="a JSON schema the version's answers follow (kept in its manifest): "
                       "a rollout's canary checks a guided completion of it against it")
    add_setting_flags(build, ("models_dir",))
    add_rollout_parsers(models_cmd)

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
    add_bench_calls(bench_cmd)
    add_bench_asr(bench_cmd)
    add_bench_gpu(bench_cmd)
    add_bench_answers(bench_cmd)
    add_bench_turn_ends(bench_cmd)
    add_sip(commands)
    return parser.parse_args(argv)


# The settings `omnivox serve` takes as flags (--max-calls for max_calls); every setting, these
# included, is also read from its environment variable (OMNIVOX_MAX_CALLS).
SERVE_FLAGS = ("host", "port", "profile", "models_dir", "model_version", "model_path",
               "data_dir", "max_calls", "call_workers", "log_level", "log_format")
# Flags of any command that are settings, whose value (when given) is handed to Settings.
SETTING_FLAGS = (*SERVE_FLAGS,)


def add_setting_flags(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    """One flag per setting, its help and default read from the setting's declaration."""
    for name in names:
        field = Settings.model_fields[name]
        default = field.get_default(call_default_factory=True)
        shown = default.relative_to(REPO_ROOT) if isinstance(default, Path) else default
        parser.add_argument(
            "--" + name.replace("_", "-"), default=None, metavar=name.split("_")[-1].upper(),
            help=f"{field.description} (default: {shown}; environment: {env_name(name)})")


def add_bench_calls(bench_cmd: Any) -> None:
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
    calls.add_argument("--api-key", default=os.environ.get("OMNIVOX_API_KEY"),
                       help="Bearer key for a server with API keys (or OMNIVOX_API_KEY)")
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
    calls.add_argument("--json", dest="json_path", type=Path, help="also write the figures here")
    calls.add_argument("--plots", dest="plots_dir", type=Path, help="write PNG plots here")
    calls.add_argument("--no-progress", action="store_true", help="no progress bar")
    calls.add_argument("--log-level", default="warning")


def add_bench_asr(bench_cmd: Any) -> None:
    from agent.bench.asr_run import add_parser

    add_parser(bench_cmd)


def bench_asr(args: argparse.Namespace, settings: Settings) -> int:
    from agent.bench.asr_run import command

    return command(args, settings)


def add_bench_answers(bench_cmd: Any) -> None:
    from agent.bench.answers import add_parser

    add_parser(bench_cmd)


def bench_answers(args: argparse.Namespace, settings: Settings) -> int:
    from agent.bench.answers import command

    return command(args, settings)


def add_bench_turn_ends(bench_cmd: Any) -> None:
    from agent.bench.turn_ends import add_parser

    add_parser(bench_cmd)


def bench_turn_ends(args: argparse.Namespace, settings: Settings) -> int:
    from agent.bench.turn_ends import command

    return command(args, settings)


def add_bench_gpu(bench_cmd: Any) -> None:
    from agent.bench.gpu import add_parser

    add_parser(bench_cmd)


def bench_gpu(args: argparse.Namespace, settings: Settings) -> int:
    from agent.bench.gpu import command

    return command(args, settings)


def add_sip(commands: Any) -> None:
    from agent.sip.command import add_parser

    add_setting_flags(add_parser(commands), ("log_level", "log_format"))


def sip_bridge(args: argparse.Namespace, settings: Settings) -> int:
    from agent.sip.command import bridge_settings, run
    from agent.sip.settings import BridgeSettingsError

    try:
        bridge = bridge_settings(args)
    except BridgeSettingsError as exc:
        raise CommandLineError(f"sip: {exc}") from None
    return run(bridge)


def concurrency_levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"levels must be whole numbers >= 1: {text!r}")
    return levels


def model_version(text: str) -> str:
    if not text.isdigit() or text.startswith("0"):
        raise argparse.ArgumentTypeError(f"a model version is a whole number >= 1: {text!r}")
    return text


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings: the flags given, then the environment, then the declared defaults."""
    given = {name: getattr(args, name) for name in SETTING_FLAGS
             if getattr(args, name, None) is not None}
    return Settings(**given)


def setting_error(exc: ValidationError) -> str:
    """One line naming each refused setting, its flag or variable, and why."""
    problems = []
    for error in exc.errors():
        path = [str(part) for part in error["loc"] if isinstance(part, str)]
        where = env_name(*path) if path else "settings"
        if path and path[0] in SETTING_FLAGS:
            where = f"--{path[0].replace('_', '-')} or {where}"
        # Never echo an API key; any other refused value helps the reader.
        got = "" if path[:1] == ["api_keys"] else f", got {error.get('input')!r}"
        problems.append(f"{'.'.join(path) or 'settings'} ({where}): {error['msg']}{got}")
    return "invalid setting " + "; ".join(problems)


class CommandLineError(Exception):
    """Input the command cannot act on; main prints it as one line and exits with 2."""


def pipeline_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """What `serve` changes in the profile's pipeline settings: with --sequential-stages, the
    profile's cascade settings with overlap off (each stage runs to its end before the next)."""
    if not args.sequential_stages:
        return {}
    from agent.profiles import load_profiles

    cascade = dict(load_profiles().get(args.profile, {}).get("cascade", {}))
    return {"cascade": {**cascade, "overlap": False}}


def serve(args: argparse.Namespace, settings: Settings) -> int:
    from agent.app import create_app, run_server
    from agent.profiles import build_pipeline
    from agent.serving.rollout_state import served_after_restart

    settings = served_after_restart(settings)  # what the last rollout left as the default
    pipeline = build_pipeline(settings, pipeline_overrides(args))
    check_served_version(pipeline.settings.family, pipeline.settings.models_dir)
    if pipeline.settings.model_path is not None:
        check_real_weights(pipeline.settings.family, pipeline.settings.model_path)
    app = create_app(settings, pipeline=pipeline)
    print(f"omnivox: serving profile {settings.profile!r} at "
          f"http://{settings.host}:{settings.port}/")
    # SIGTERM drains (new calls refused, live ones go on up to drain_timeout_s), then stops
    # gracefully (calls closed, workers stopped) and exits 0.
    return run_server(app, settings)


def call_worker(args: argparse.Namespace, _: Settings) -> int:
    """Serve one call worker's app on its socket until the front stops it (SIGTERM)."""
    import uvicorn

    from agent.app import create_worker_app

    settings = Settings.model_validate_json(args.settings_file.read_text())
    logs.configure(settings.log_level, settings.log_format)
    app = create_worker_app(settings, args.owner)
    config = uvicorn.Config(app, uds=args.socket, log_level=settings.log_level, log_config=None)
    uvicorn.Server(config).run()
    return 0


def check_served_version(family: str, root: Path) -> None:
    """Before serving: the version is built (or version 1, built on first use) and its engine
    range admits the running engines; the server checks its files as it loads it."""
    from pipeline.model_versions import (
        ModelVersionError,
        built_manifest,
        check_engines,
        verify_version,
    )

    if "." in family:
        return
    try:
        manifest = built_manifest(root, family)
        if manifest is None:
            verify_version(family, root)  # refuses a version > 1 that is not built
        else:
            check_engines(family, root, manifest)
    except ModelVersionError as exc:
        raise CommandLineError(str(exc)) from None


def check_real_weights(family: str, path: Path) -> None:
    """Before serving: the real checkpoint is there and of the family's architecture."""
    from pipeline.models import check_checkpoint

    try:
        check_checkpoint(family, path)
    except (OSError, ValueError) as exc:
        raise CommandLineError(str(exc)) from None


def add_rollout_parsers(models_cmd: Any) -> None:
    from agent.serving.rollout_command import add_parsers

    add_parsers(models_cmd)


def rollout_model(args: argparse.Namespace, settings: Settings) -> int:
    from agent.serving.rollout_command import rollout

    return rollout(args)


def retire_model(args: argparse.Namespace, settings: Settings) -> int:
    from agent.serving.rollout_command import retire

    return retire(args)


def build_models(args: argparse.Namespace, settings: Settings) -> int:
    from agent.profiles import load_profiles
    from pipeline.families import load_family
    from pipeline.model_versions import (
        built_manifest,
        declare_output_schema,
        declared_output_schema,
        version_root,
    )
    from pipeline.models import build_family, build_options

    family = str(load_profiles().get(args.family, {}).get("family", args.family))
    try:
        load_family(family)
        build_options(family, args.seed)
    except ValueError as exc:
        raise CommandLineError(str(exc)) from None
    schema = output_schema_of(args.output_schema)
    root = version_root(settings.models_dir, args.version)
    built_seed = (built_manifest(root, family) or {}).get("seed")
    schema = schema or declared_output_schema(root, family)  # a rebuild keeps its declaration
    if args.seed is not None and built_seed is not None and args.seed != built_seed:
        raise CommandLineError(
            f"{family} version {args.version} is built from seed {built_seed}: a version's "
            f"weights never change; build another --version, or remove {root / family} first")
    build_family(family, str(root), built_seed if args.seed is None else args.seed)
    if schema is not None:
        declare_output_schema(root, family, schema)
    checksum = (built_manifest(root, family) or {}).get("checksum", "?")
    print(f"omnivox: {family} version {args.version} ready in {root / family} "
          f"(checksum {checksum})")
    return 0


def output_schema_of(path: Path | None) -> dict[str, Any] | None:
    """The JSON schema in `path` (None: none given), once it is one that guided decoding
    enforces exactly; CommandLineError saying what is wrong with it."""
    if path is None:
        return None
    import jsonschema

    from agent.guided.unsafe_schema import REFUSAL, unsafe_keyword

    try:
        schema = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CommandLineError(f"--output-schema {path}: not a readable JSON file: {exc}") \
            from None
    if not isinstance(schema, dict):
        raise CommandLineError(f"--output-schema {path}: a JSON schema is an object")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise CommandLineError(f"--output-schema {path}: not a JSON schema: {exc.message}") \
            from None
    unsafe = unsafe_keyword(schema)
    if unsafe is not None:
        raise CommandLineError(f"--output-schema {path}: {unsafe}: {REFUSAL}")
    return schema


def bench_pipeline(args: argparse.Namespace, settings: Settings) -> int:
    from agent.bench.pipeline_turns import run_bench
    from agent.bench.report import print_pipeline_report, write_json
    from agent.profiles import pipeline_settings

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # the figures, not engine chatter
    result = run_bench(pipeline_settings(settings), tokens=args.tokens)
    result["profile"] = settings.profile
    print_pipeline_report(result)
    if args.json_path:
        write_json(args.json_path, result)
    return 0


def bench_turn(args: argparse.Namespace, settings: Settings) -> int:
    from agent.bench.turn import run

    if args.turns < 1:
        raise CommandLineError("bench turn: --turns must be at least 1")
    return run(settings, args.url, args.turns, args.json_path)


def bench_calls(args: argparse.Namespace, settings: Settings) -> int:
    from agent.bench.calls import Options, run

    turns = None if args.duration is not None else args.turns
    if turns is not None and turns < 1:
        raise CommandLineError("bench calls: --turns must be at least 1")
    if args.duration is not None and args.duration <= 0:
        raise CommandLineError("bench calls: --duration must be positive")
    if args.barge_in_every < 0 or args.barge_in_every == 1:
        raise CommandLineError("bench calls: --barge-in-every must be 0 or at least 2")
    if args.sequential_url and not args.url:
        raise CommandLineError("bench calls: --sequential-url goes with --url")
    if args.bench_call_workers and args.url:
        raise CommandLineError("bench calls: --call-workers starts its own servers, no --url")
    if args.url and args.compare_sequential and not args.sequential_url:
        raise CommandLineError("bench calls: --compare-sequential with --url needs "
                               "--sequential-url (a server started with --sequential-stages)")
    return run(Options(
        concurrency=args.concurrency, turns=turns, duration_s=args.duration, url=args.url,
        profile=settings.profile, models_dir=settings.models_dir,
        workers=args.workers, pause_s=args.pause, barge_in_every=args.barge_in_every,
        reply_tokens=args.reply_tokens, codec=args.codec, api_key=args.api_key,
        callers=args.callers, compare_sequential=args.compare_sequential,
        sequential_url=args.sequential_url,
        speech_dir=args.speech_dir, json_path=args.json_path, plots_dir=args.plots_dir,
        progress=not args.no_progress, call_workers=args.bench_call_workers))


COMMANDS = {
    ("serve", None): serve,
    ("call-worker", None): call_worker,
    ("models", "build"): build_models,
    ("models", "rollout"): rollout_model,
    ("models", "retire"): retire_model,
    ("bench", "pipeline"): bench_pipeline,
    ("bench", "turn"): bench_turn,
    ("bench", "calls"): bench_calls,
    ("bench", "asr"): bench_asr,
    ("bench", "gpu"): bench_gpu,
    ("bench", "answers"): bench_answers,
    ("bench", "turn-ends"): bench_turn_ends,
    ("sip", None): sip_bridge,
}


def main(argv: list[str] | None = None) -> int:
    from agent.profiles import ProfileError

    args = parse_args(argv)
    command = COMMANDS[(args.command, getattr(args, f"{args.command}_command", None))]
    try:
        settings = settings_of(args)
        logs.configure(settings.log_level, settings.log_format)
        return command(args, settings)
    except ValidationError as exc:
        message = setting_error(exc)
    except (CommandLineError, ProfileError) as exc:
        message = str(exc)
    print(f"omnivox: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
