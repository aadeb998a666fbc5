"""`omnivox bench check` (`make bench-check`): the short benches of the turn path, each figure
beside the one recorded in `docs/measurements/baseline.json`, with the ratio.

Run: `bench pipeline` (tiny), `bench calls` on tiny at 1 and at 4 calls, and one local call.
Each runs as its own `omnivox bench` process (each starts its own server or pipeline), writing
its figures as JSON; the figures below are read out of those. A figure more than `TOLERANCE`
worse than its baseline is flagged. This is a guard for a person to read, not a test: timings
on a shared 2-core machine are noisy (compare a flagged figure again before believing it).
`--record` writes the figures of this run as the new baseline, with the commit they ran at.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.bench.report import write_json
from agent.config import REPO_ROOT
from pipeline import environment

BASELINE = REPO_ROOT / "docs" / "measurements" / "baseline.json"
TOLERANCE = 0.25  # a figure this much worse than its baseline is flagged

Reading = Callable[[dict[str, Any]], float | None]


@dataclass(frozen=True)
class Run:
    """One `omnivox bench` command and the figures read from its JSON."""

    name: str
    args: tuple[str, ...]
    figures: dict[str, tuple[Reading, bool]]  # figure -> (reading, higher is better)


def _level(result: dict[str, Any], calls: int) -> dict[str, Any]:
    return next(level for level in result["levels"] if level["concurrency"] == calls)


def _stat(calls: int, key: str, stat: str = "p50") -> Reading:
    return lambda result: _level(result, calls)[key][stat]


def _went(calls: int, key: str) -> Reading:
    return lambda result: _level(result, calls)["time_went_ms"][key]["p50"]


def _count(calls: int, key: str) -> Reading:
    return lambda result: float(_level(result, calls)[key])


def _concurrent(turns: int, key: str, scale: float = 1.0) -> Reading:
    return lambda result: next(row[key] for row in result["concurrency"]
                               if row["turns"] == turns) * scale


def calls_figures(calls: int) -> dict[str, tuple[Reading, bool]]:
    prefix = f"{calls} call{'s' if calls > 1 else ''}"
    return {
        f"{prefix}: first audio after the end-of-turn silence p50 ms":
            (_stat(calls, "ttfa_after_vad_ms"), False),
        f"{prefix}: first audio after the end-of-turn silence p95 ms":
            (_stat(calls, "ttfa_after_vad_ms", "p95"), False),
        f"{prefix}: Thinker's first token p50 ms": (_went(calls, "thinker_first_token_ms"), False),
        f"{prefix}: Talker's first tokens p50 ms": (_went(calls, "talker_first_tokens_ms"), False),
        f"{prefix}: VoiceBox's first chunk p50 ms":
            (_went(calls, "voicebox_first_chunk_ms"), False),
        f"{prefix}: barge-in stop p95 ms": (_stat(calls, "barge_in_stop_ms", "p95"), False),
        f"{prefix}: gaps in replies": (_count(calls, "gaps"), False),
        f"{prefix}: longest gap ms": (_count(calls, "gaps_ms_max"), False),
    }


RUNS = (
    Run("pipeline tiny", ("pipeline", "--profile", "tiny"), {
        "first audio of a 100-token reply ms": (
            lambda r: r["cascade_vs_sequential"]["cascade_first_audio_s"] * 1e3, False),
        "1 turn: first audio ms": (_concurrent(1, "median_first_audio_s", 1e3), False),
        "32 turns: first audio p50 ms": (_concurrent(32, "median_first_audio_s", 1e3), False),
        "32 turns: turns/s": (_concurrent(32, "turns_per_s"), True),
    }),
    Run("calls tiny", ("calls", "--profile", "tiny", "--concurrency", "1,4", "--turns", "8",
                       "--no-progress"),
        {**calls_figures(1), **calls_figures(4)}),
    Run("calls local", ("calls", "--profile", "local", "--concurrency", "1", "--turns", "6",
                        "--no-progress"), {
        "1 call: first audio after the end of speech p50 ms": (_stat(1, "ttfa_ms"), False),
        "1 call: recognition p50 ms": (_went(1, "asr_ms"), False),
        "1 call: Thinker's first token p50 ms": (_went(1, "thinker_first_token_ms"), False),
        "1 call: VoiceBox's first chunk p50 ms": (_went(1, "voicebox_first_chunk_ms"), False),
        "1 call: barge-in stop p95 ms": (_stat(1, "barge_in_stop_ms", "p95"), False),
        "1 call: gaps in replies": (_count(1, "gaps"), False),
    }),
)


def add_parser(bench_cmd: Any) -> None:
    """`omnivox bench check`'s flags."""
    check = bench_cmd.add_parser(
        "check", help="the short turn-path benches against docs/measurements/baseline.json "
        "(a figure over 25%% worse is flagged)")
    check.add_argument("--baseline", type=Path, default=BASELINE,
                       help="the recorded figures (default: %(default)s)")
    check.add_argument("--record", action="store_true",
                       help="write this run's figures as the baseline, with the commit")
    check.add_argument("--only", choices=[run.name for run in RUNS], action="append",
                       help="run only this bench (repeatable)")
    check.add_argument("--json", dest="json_path", type=Path, help="also write the figures here")


def command(args: argparse.Namespace, settings: Any) -> int:
    """`omnivox bench check` from its parsed flags."""
    runs = [run for run in RUNS if not args.only or run.name in args.only]
    figures: dict[str, dict[str, Any]] = {}
    for run in runs:
        figures.update(measure(run, settings.models_dir))
    baseline = load(args.baseline)
    rows = compare(figures, baseline.get("figures", {}))
    print_table(rows, baseline)
    result = {"commit": commit(), "recorded": datetime.date.today().isoformat(),
              "machine": machine(), "figures": figures}
    if args.json_path:
        write_json(args.json_path, {**result, "rows": rows})
    if args.record:
        if args.only and baseline:  # keep the figures of the benches not run this time
            result["figures"] = {**baseline.get("figures", {}), **figures}
        args.baseline.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.baseline, result)
        print(f"(the baseline, at commit {result['commit']})")
    return 0


def measure(run: Run, models_dir: Path) -> dict[str, dict[str, Any]]:
    """Run one bench in its own process; its figures, named `run.name: figure`."""
    with tempfile.TemporaryDirectory(prefix="omnivox-check-") as scratch:
        out = Path(scratch) / "figures.json"
        argv = [sys.executable, "-m", "agent.cli", "bench", *run.args,
                "--models-dir", str(models_dir), "--json", str(out)]
        print(f"omnivox bench check: {run.name}: {' '.join(argv[3:-2])}", flush=True)
        env = environment.child_environment({"PYTHONUNBUFFERED": "1"})
        done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0 or not out.exists():
            sys.stdout.write(done.stdout[-4000:] + done.stderr[-4000:])
            raise RuntimeError(f"bench check: {run.name} failed (exit {done.returncode})")
        return read_figures(run, json.loads(out.read_text()))


def read_figures(run: Run, result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`run`'s figures out of its bench's JSON, named `run.name: figure`."""
    figures = {}
    for name, (reading, higher) in run.figures.items():
        value = _read(reading, result)
        figures[f"{run.name}: {name}"] = {
            "value": None if value is None else round(value, 3), "higher_is_better": higher}
    return figures


def _read(reading: Reading, result: dict[str, Any]) -> float | None:
    """A figure, or None where the run had none (no barge-in happened, no stage stamp)."""
    try:
        return reading(result)
    except (KeyError, StopIteration, TypeError):
        return None


def compare(figures: dict[str, dict[str, Any]], recorded: dict[str, dict[str, Any]]
            ) -> list[dict[str, Any]]:
    """Each figure beside its baseline: the ratio (now / then) and whether it is flagged."""
    rows = []
    for name, figure in figures.items():
        now, then = figure["value"], recorded.get(name, {}).get("value")
        ratio = now / then if now is not None and then else None
        rows.append({"figure": name, "now": now, "baseline": then, "ratio": ratio,
                     "worse": worse(now, then, figure["higher_is_better"])})
    return rows


def worse(now: float | None, then: float | None, higher_is_better: bool) -> bool:
    """Whether `now` is more than TOLERANCE worse than `then` (a count up from 0 is)."""
    if now is None or then is None:
        return False
    if higher_is_better:
        return now < then * (1 - TOLERANCE)
    return now > then * (1 + TOLERANCE) if then else now > 0


def print_table(rows: list[dict[str, Any]], baseline: dict[str, Any]) -> None:
    if baseline:
        print(f"\nagainst {baseline.get('commit', '?')} ({baseline.get('recorded', '?')}, "
              f"{baseline.get('machine', '?')}); flagged: more than {TOLERANCE:.0%} worse")
    else:
        print("\nno baseline recorded yet (--record writes one)")
    width = max(len(row["figure"]) for row in rows)
    print(f"{'figure':<{width}} {'now':>9} {'baseline':>9} {'ratio':>6}")
    for row in rows:
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}"
        flag = "  WORSE" if row["worse"] else ""
        print(f"{row['figure']:<{width}} {_cell(row['now'])} {_cell(row['baseline'])} "
              f"{ratio:>6}{flag}")
    flagged = sum(row["worse"] for row in rows)
    print(f"{flagged} of {len(rows)} figures more than {TOLERANCE:.0%} worse than the baseline")


def _cell(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value:>9.1f}"


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def commit() -> str:
    """The commit the figures ran at (`+dirty` with uncommitted changes)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              check=False).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
