"""The `omnivox` command line: serve, build models, run benchmarks."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agent.config import Settings, add_setting_flags, env_name
from agent.ops import logs

if TYPE_CHECKING:
    from pipeline.model_version import ModelVersion


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
    build.add_argument("--real-widths", type=Path, default=None, metavar="DIR",
                       help="instead: write a checkpoint of the family at its published model's "
                       "real widths, layers cut, random weights, in the published layout, to "
                       "DIR (served with --model-path DIR; omni, orpheus, qwen3-omni)")
    build.add_argument("--layers", type=int, default=1,
                       help="with --real-widths: layers per stack (default 1)")
    add_setting_flags(build, ("models_dir",))
    add_rollout_parsers(models_cmd)

    add_bench(commands)
    add_sip(commands)
    return parser.parse_args(argv)


# The settings `omnivox serve` takes as flags (--max-calls for max_calls); every setting, these
# included, is also read from its environment variable (OMNIVOX_MAX_CALLS).
SERVE_FLAGS = ("host", "port", "profile", "models_dir", "model_version", "model_path",
               "device", "data_dir", "max_calls", "call_workers", "log_level", "log_format")
# Flags of any command that are settings, whose value (when given) is handed to Settings.
SETTING_FLAGS = (*SERVE_FLAGS,)


def add_bench(commands: Any) -> None:
    from agent.bench.command import add_parser

    add_parser(commands)


def bench(args: argparse.Namespace, settings: Settings) -> int:
    from agent.bench.command import BenchUsageError, run

    try:
        return run(args, settings)
    except BenchUsageError as exc:
        raise CommandLineError(str(exc)) from None


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
    check_served_version(pipeline.settings.family, pipeline.settings.version)
    if pipeline.settings.model_path is not None:
        check_real_weights(pipeline.settings.family, pipeline.settings.model_path)
    check_device(settings)
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


def check_served_version(family: str, version: ModelVersion) -> None:
    """Before serving: the version is built (or version 1, built on first use) and its engine
    range admits the running engines; the server checks its files as it loads it."""
    from pipeline.version_checks import (
        ModelVersionError,
        built_manifest,
        check_engines,
        verify_version,
    )

    if "." in family:
        return
    try:
        manifest = built_manifest(version, family)
        if manifest is None:
            verify_version(family, version)  # refuses a version > 1 that is not built
        else:
            check_engines(family, version, manifest)
    except ModelVersionError as exc:
        raise CommandLineError(str(exc)) from None


def check_real_weights(family: str, path: Path) -> None:
    """Before serving: the real checkpoint is there and of the family's architecture."""
    from pipeline.models import check_checkpoint

    try:
        check_checkpoint(family, path)
    except (OSError, ValueError) as exc:
        raise CommandLineError(str(exc)) from None


def check_device(settings: Settings) -> None:
    """Before serving: a profile with GPU settings has a GPU, or was told to run on the CPU."""
    from agent.profiles import gpu_answers, needs_gpu

    if settings.device == "auto" and needs_gpu(settings.profile) and not gpu_answers():
        raise CommandLineError(
            f"profile {settings.profile!r} is sized for a GPU and nvidia-smi finds none here; "
            "--device cpu (OMNIVOX_DEVICE=cpu) runs it on the CPU instead, slowly (a rehearsal)")


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
    from pipeline.model_version import ModelVersion
    from pipeline.models import build_family, build_options
    from pipeline.version_checks import (
        built_manifest,
        declare_output_schema,
        declared_output_schema,
    )

    family = str(load_profiles().get(args.family, {}).get("family", args.family))
    try:
        module = load_family(family)
        build_options(family, args.seed)
    except ValueError as exc:
        raise CommandLineError(str(exc)) from None
    if args.real_widths is not None:
        return write_real_widths(module, args)
    schema = output_schema_of(args.output_schema)
    version = ModelVersion(Path(settings.models_dir), args.version)
    root = version.root
    built_seed = (built_manifest(version, family) or {}).get("seed")
    schema = schema or declared_output_schema(version, family)  # a rebuild keeps its declaration
    if args.seed is not None and built_seed is not None and args.seed != built_seed:
        raise CommandLineError(
            f"{family} version {args.version} is built from seed {built_seed}: a version's "
            f"weights never change; build another --version, or remove {root / family} first")
    build_family(family, str(root), built_seed if args.seed is None else args.seed)
    if schema is not None:
        declare_output_schema(version, family, schema)
    checksum = (built_manifest(version, family) or {}).get("checksum", "?")
    print(f"omnivox: {family} version {args.version} ready in {root / family} "
          f"(checksum {checksum})")
    return 0


def write_real_widths(family: Any, args: argparse.Namespace) -> int:
    """`models build PROFILE --real-widths DIR`: the family's real-width checkpoint in DIR."""
    write = getattr(family, "write_real_widths", None)
    if write is None:
        raise CommandLineError(f"{args.family}: no real-width checkpoint to write (the "
                               "families of omni, orpheus and qwen3-omni have one)")
    if args.layers < 1:
        raise CommandLineError(f"--layers: at least 1, got {args.layers}")
    if args.real_widths.exists() and any(args.real_widths.iterdir()):
        raise CommandLineError(f"{args.real_widths} is not empty: a checkpoint is written into "
                               "a new directory")
    print(f"omnivox: writing {args.family} at its real widths, {args.layers} layer(s) a stack, "
          f"random weights, into {args.real_widths} (about a minute a layer)")
    write(args.real_widths, args.layers, 0 if args.seed is None else args.seed)
    print(f"omnivox: done; serve it with: omnivox serve --profile {args.family} --device cpu "
          f"--model-path {args.real_widths}")
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


COMMANDS = {
    ("serve", None): serve,
    ("call-worker", None): call_worker,
    ("models", "build"): build_models,
    ("models", "rollout"): rollout_model,
    ("models", "retire"): retire_model,
    ("bench", None): bench,  # each benchmark: agent/bench/command.py
    ("sip", None): sip_bridge,
}


def main(argv: list[str] | None = None) -> int:
    from agent.profiles import ProfileError

    args = parse_args(argv)
    group = getattr(args, f"{args.command}_command", None)
    command = COMMANDS.get((args.command, group)) or COMMANDS[(args.command, None)]
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
