"""`omnivox bench gpu`: the real-architecture families at their real sizes, no weights, on a GPU.

For each family (`gpu_families`: qwen25_omni, orpheus, qwen3_omni): build it, start its
pipeline, run each level of concurrent turns (`pipeline_turns.run_turn`; a short caller
utterance with each turn: every family's Thinker hears it), take first audio p50/p95, turns/s
and each stage's GPU memory (`gpu_memory`), stop it; then run tests/test_cuda_ipc_transport.py
and tests/test_cuda_ipc_gpu.py. Figures are printed and written as JSON, none asserted. The
levels: 1, 16 and 64 by default, any list (`--levels 1,8`), or a named set (`LEVEL_SETS`):
`--levels vllm-omni` runs 1, 4, 10 and 64, the concurrencies issue 32 names as vLLM-Omni's
published Qwen3-Omni runs, so the two can be set side by side.
Without CUDA it refuses in one line (exit 2); `--size tiny` runs the same harness on the CPU
with the tiny checkpoints, and `--dry-run` builds the directories and prints each stage's
parameters and weight memory without starting anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from agent.bench.gpu_families import FAMILIES, FamilyRun, prepare
from agent.bench.gpu_memory import MemoryWatch
from agent.bench.gpu_tests import CUDA_IPC_TESTS, pytest_outcome
from agent.bench.pipeline_turns import run_turn
from pipeline import environment

NO_CUDA = ("omnivox bench gpu: no CUDA device here (torch.cuda.is_available() is False); "
           "--size tiny runs the same check on the CPU, --dry-run only builds and sizes")
LEVELS = {"real": [1, 16, 64], "tiny": [1, 2]}
LEVEL_SETS = {"vllm-omni": [1, 4, 10, 64]}  # named sets of levels `--levels` takes
REPLY_TOKENS = {"real": 24, "tiny": 8}
LEVEL_TIMEOUT_S = {"real": 60.0, "tiny": 300.0}  # a level past it is cut, and says so
CALLER_AUDIO_S = 1.0
# What every turn's reply recites at real size (random weights write ids the tiny tokenizer
# mostly cannot read, which left the Talkers idle): several clauses, so the Talker gets every
# chunk and at least 150 codes a turn (gpu_families bounds them).
RECITED = ("Thank you for calling. The first train to the city leaves at six in the morning, "
           "and the next one follows every twenty minutes until noon. Seats are free to book.")
GIB_F = float(2**30)


def add_parser(bench_cmd: Any) -> None:
    """`omnivox bench gpu`'s flags."""
    gpu = bench_cmd.add_parser(
        "gpu", help="real-size qwen25_omni, orpheus and qwen3_omni, dummy weights, on a GPU: "
        "first audio, turns/s, memory per stage, CUDA IPC test")
    gpu.add_argument("--size", choices=["real", "tiny"], default="real",
                     help="real: the release sizes, no weights (GPU); tiny: the CPU rehearsal")
    gpu.add_argument("--dry-run", action="store_true",
                     help="build the directories, print parameters and weight memory, stop")
    gpu.add_argument("--families", default=",".join(FAMILIES), help="comma-separated")
    gpu.add_argument("--levels", type=level_list, default=None,
                     help="concurrent turns, comma-separated (default: 1,16,64; tiny: 1,2), "
                     "or a named set: vllm-omni (1,4,10,64: vLLM-Omni's Qwen3-Omni runs)")
    gpu.add_argument("--root", type=Path, default=None,
                     help="where the families are built (default: <models_dir>/gpu-check-SIZE)")
    gpu.add_argument("--json", dest="json_path", default="gpu-check.json",
                     help="write the figures here (default: gpu-check.json)")


def command(args: Any, settings: Any) -> int:
    """`omnivox bench gpu` from its parsed flags."""
    import torch

    cuda = torch.cuda.is_available()
    if args.size == "real" and not cuda and not args.dry_run:
        print(NO_CUDA)
        return 2
    environment.set_default("VLLM_LOGGING_LEVEL")  # the figures, not engine chatter
    root = args.root or Path(settings.models_dir) / f"gpu-check-{args.size}"
    levels = args.levels or LEVELS[args.size]
    families = [name.strip() for name in args.families.split(",") if name.strip()]
    result = run_check(families, args.size, root, cuda and args.size == "real",
                       levels, args.dry_run)
    print_report(result)
    Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {args.json_path}")
    return 0


def level_list(text: str) -> list[int]:
    """`--levels`: comma-separated counts of concurrent turns, or a named set (`LEVEL_SETS`)."""
    if text in LEVEL_SETS:
        return LEVEL_SETS[text]
    try:
        levels = [int(n) for n in text.split(",")]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: positive counts of concurrent turns, comma-separated, or one of "
            f"{', '.join(LEVEL_SETS)}")
    return levels


def run_check(families: list[str], size: str, root: Path, cuda: bool, levels: list[int],
              dry_run: bool) -> dict[str, Any]:
    """The check's figures (see the module's docstring)."""
    result: dict[str, Any] = {"size": size, "cuda": cuda, "dry_run": dry_run,
                              "device": _device_name(cuda), "levels": levels, "families": {}}
    for family in families:
        began = time.perf_counter()
        run = prepare(family, size, root, cuda)
        row: dict[str, Any] = {"build_s": round(time.perf_counter() - began, 1),
                               "gpu_profile": run.gpu_profile, "stages": run.sizes}
        if not dry_run:
            try:  # one family failing still leaves the other's figures and the IPC test
                row |= asyncio.run(_serve(run, levels, size))
            except Exception as exc:  # reported in the figures, not raised
                row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        result["families"][family] = row
    if not dry_run:
        result["cuda_ipc_tests"] = {path.name: pytest_outcome(path) for path in CUDA_IPC_TESTS}
    return result


async def _serve(run: FamilyRun, levels: list[int], size: str) -> dict[str, Any]:
    """Start the family's pipeline, run each level, stop it."""
    from pipeline.settings import PipelineSettings
    from pipeline.turns.orchestrator import Pipeline

    audio = caller_audio() if run.audio else None
    began = time.perf_counter()
    async with Pipeline(PipelineSettings.model_validate(run.settings)) as pipe:
        if not pipe.health().ready:
            raise RuntimeError(f"{run.family} pipeline not ready: {pipe.health().stages}")
        start_s = time.perf_counter() - began
        tokens = REPLY_TOKENS[size]
        recite = RECITED if size == "real" else None
        await run_turn(pipe, f"gpu-{run.family}-warm-up", tokens, audio=audio, recite=recite)
        rows = []
        async with MemoryWatch(pipe) as memory:  # sampled on a CPU too: the figures are 0
            for n in levels:
                rows.append(await _level(pipe, run.family, n, tokens, audio, recite,
                                         LEVEL_TIMEOUT_S[size]))
    return {"start_s": round(start_s, 1), "reply_tokens": tokens, "levels": rows,
            "gpu_memory": memory.figures()}


async def _level(pipe: Any, family: str, n: int, tokens: int, audio: np.ndarray | None,
                 recite: str | None, timeout_s: float) -> dict[str, Any]:
    """`n` turns started at once: first audio p50/p95, turns/s (or that it ran out of time)."""
    began = time.perf_counter()
    turns = (run_turn(pipe, f"gpu-{family}-{n}-{i}", tokens, audio=audio, recite=recite)
             for i in range(n))
    try:
        firsts = await asyncio.wait_for(asyncio.gather(*turns), timeout_s)
    except TimeoutError:
        return {"turns": n, "timed_out_after_s": timeout_s}
    wall = time.perf_counter() - began
    return {"turns": n, "wall_s": round(wall, 3), "turns_per_s": round(n / wall, 3),
            "first_audio_p50_s": round(statistics.median(firsts), 4),
            "first_audio_p95_s": round(percentile(firsts, 95), 4)}


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, linearly interpolated (numpy's default)."""
    return float(np.percentile(np.asarray(values, dtype=float), q))


def caller_audio(seconds: float = CALLER_AUDIO_S) -> np.ndarray:
    """A short caller utterance: a 220 Hz tone with a syllable-rate envelope, int16 at 16 kHz
    (what it says does not matter: the audio tower's cost is its length)."""
    t = np.arange(int(16000 * seconds)) / 16000
    wave = np.sin(2 * np.pi * 220 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))
    return (wave * 8000).astype(np.int16)


def print_report(result: dict[str, Any]) -> None:
    """The figures as a few readable lines."""
    print(f"omnivox bench gpu: size {result['size']} on {result['device']}"
          f"{' (dry run)' if result['dry_run'] else ''}")
    for family, row in result["families"].items():
        settings = f", the {row['gpu_profile']} profile's GPU settings" if row.get(
            "gpu_profile") else ""
        print(f"{family}: built in {row['build_s']} s{settings}")
        for stage, parts in row["stages"].items():
            for part, size in parts.items():
                print(f"  {stage:8} {part:40} {size['parameters'] / 1e6:9.1f} M parameters "
                      f"{size['weight_bytes'] / GIB_F:7.2f} GiB weights")
        for level in row.get("levels", []):
            print(f"  {level['turns']:3} turns: " + ", ".join(
                f"{key} {value}" for key, value in level.items() if key != "turns"))
        if "error" in row:
            print(f"  failed: {row['error']}")
        if "gpu_memory" in row:
            print(f"  GPU memory peaks (MiB): {row['gpu_memory']}")
    for name, outcome in result.get("cuda_ipc_tests", {}).items():
        print(f"tests/{name}: {outcome}")



def _device_name(cuda: bool) -> str:
    if not cuda:
        return "CPU"
    import torch

    return str(torch.cuda.get_device_name(0))
