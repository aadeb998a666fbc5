"""`omnivox bench gpu-torch` (`python -m agent.bench.gpu_torch`): the real families' torch-side
stages at their REAL size on one GPU, without vLLM.

The check that runs where vLLM cannot (a GPU host lent for checks has torch and transformers,
no vLLM, no network): random weights built directly on the device, no files. Parts, each built,
timed and freed in turn (docs/gpu-check.md):

- token2wav (Qwen2.5-Omni-7B's DiT + BigVGAN) through the family's WindowRenderer at each level
  of concurrent streams: time to the first window, real-time factor (`gpu_torch_streams`);
- the audio tower per second of caller audio, and the Thinker's hidden-state model per prompt
  and per reply step (`gpu_torch_parts`);
- SNAC 24 kHz at each level of streams (needs the `snac` package: "not run" without it);
- Qwen3-Omni-30B-A3B's: the audio tower, the code predictor batched across turns, code2wav
  streamed and batched, and the Thinker's layer copy for the Talker's rows where the device has
  the memory for its 28.4 GiB (`gpu_torch_qwen3`);
- then pytest on the CUDA IPC transport's tests, in a subprocess (`gpu_tests`).

It prints an estimate first (`gpu_torch_estimate`), then a table, and writes the figures as JSON
with the modules it imported of those it must not (vLLM, the server's): none. Nothing is
asserted on speed. `--size tiny --device cpu` rehearses it on a CPU in seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

PARTS = ("token2wav", "audio_tower", "snac", "thinker_states", "qwen3_audio_tower",
         "qwen3_code_predictor", "qwen3_code2wav", "qwen3_thinker_rows", "cuda_ipc_tests")
# what the check must never import: vLLM, and the server's web, WebRTC and messaging stack
FORBIDDEN = ("vllm", "fastapi", "starlette", "uvicorn", "aiortc", "msgspec", "zmq", "pydantic")
NO_CUDA = "omnivox bench gpu-torch: no CUDA device here (torch.cuda.is_available() is False)"
BUDGET_S = 420.0  # parts not started by then are skipped (the host's run limit is 8 minutes)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The check's flags (`omnivox bench gpu-torch` and `python -m agent.bench.gpu_torch`)."""
    parser.add_argument("--size", choices=["real", "tiny"], default="real")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                        help="default: bfloat16 on CUDA, float32 on a CPU")
    parser.add_argument("--streams", default=None,
                        help="concurrent streams per level, comma-separated (default: 1,16,64; "
                        "tiny: 1,2)")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S,
                        help="skip what would start after this many seconds")
    parser.add_argument("--estimate-only", action="store_true",
                        help="print the memory and time estimate (meta device) and stop")
    parser.add_argument("--json", dest="json_path", default="gpu-torch-check.json")


def add_parser(bench_cmd: Any) -> None:
    """`omnivox bench gpu-torch`'s flags."""
    add_flags(bench_cmd.add_parser(
        "gpu-torch", help="real-size token2wav, audio towers, SNAC, hidden-state model, "
        "Qwen3-Omni's code predictor, code2wav and layer copy on a GPU without vLLM: first "
        "window, real-time factor, ms per audio second"))


def command(args: Any, settings: Any) -> int:
    """`omnivox bench gpu-torch` from its parsed flags (the server's settings are not used)."""
    import torch

    from agent.bench.gpu_torch_estimate import estimate
    from agent.bench.gpu_torch_kit import Target

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"{NO_CUDA}: --device cuda asked")
        return 2
    if args.size == "real" and device.type == "cpu" and not args.estimate_only:
        print(f"{NO_CUDA}: --size real needs a GPU (--size tiny rehearses on a CPU, "
              "--estimate-only sizes the real parts)")
        return 2
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    levels = ([int(n) for n in args.streams.split(",")] if args.streams
              else [1, 16, 64] if args.size == "real" else [1, 2])
    parts = [name.strip() for name in args.parts.split(",") if name.strip()]
    target = Target(args.size, device, dtype)
    _quiet_transformers()
    plan = estimate(target, levels, "snac" in parts and snac_missing() is None)
    print_estimate(plan)
    if args.estimate_only:
        return 0
    result = run_check(target, levels, parts, args.budget_s) | {"estimate": plan}
    print_report(result)
    Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {args.json_path}")
    return 0


def run_check(target: Any, levels: list[int], parts: list[str], budget_s: float
              ) -> dict[str, Any]:
    """Each asked part in turn (see the module's docstring): its figures, or why not."""
    import torch
    import transformers

    began = time.perf_counter()
    result: dict[str, Any] = {
        "check": "gpu-torch", "size": target.size, "device": _device_name(target.device),
        "dtype": str(target.dtype).removeprefix("torch."), "streams": levels,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "parts": {}}
    for name in parts:
        spent = time.perf_counter() - began
        if spent > budget_s:
            result["parts"][name] = {"not_run": f"time budget spent ({spent:.0f} of "
                                     f"{budget_s:.0f} s)"}
            continue
        result["parts"][name] = run_part(name, target, levels)
    result["forbidden_imported"] = sorted(
        name for name in sys.modules if name.split(".")[0] in FORBIDDEN)
    result["wall_s"] = round(time.perf_counter() - began, 1)
    return result


def run_part(name: str, target: Any, levels: list[int]) -> dict[str, Any]:
    """One part's figures with its build and run seconds (and peak CUDA memory), or why it did
    not run: a failing part is reported, the next one still runs."""
    import torch

    if name == "snac" and (missing := snac_missing()):
        return {"not_run": missing}
    began = time.perf_counter()
    if target.cuda:
        torch.cuda.reset_peak_memory_stats(target.device)
    try:
        row = _measure(name)(target, levels)
    except Exception as exc:  # reported in the figures, the other parts still measured
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    finally:
        gc.collect()
        if target.cuda:
            torch.cuda.empty_cache()
    row["seconds"] = round(time.perf_counter() - began, 1)
    if target.cuda:
        row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(target.device) / 2**30, 2)
    return row


def _measure(name: str) -> Callable[[Any, list[int]], dict[str, Any]]:
    """The function measuring part `name` at a target and levels of streams."""
    from agent.bench import gpu_torch_parts as parts
    from agent.bench import gpu_torch_qwen3 as qwen3
    from agent.bench import gpu_torch_streams as streams
    from agent.bench.gpu_tests import CUDA_IPC_TESTS, pytest_outcome

    measures: dict[str, Callable[[Any, list[int]], dict[str, Any]]] = {
        "token2wav": lambda target, levels: streams.token2wav_part(target, levels, True),
        "snac": streams.snac_part,
        "audio_tower": lambda target, _: parts.audio_tower_part(target),
        "thinker_states": parts.thinker_states_part,
        "qwen3_audio_tower": lambda target, _: qwen3.audio_tower_part(target),
        "qwen3_code_predictor": qwen3.code_predictor_part,
        "qwen3_code2wav": qwen3.code2wav_part,
        "qwen3_thinker_rows": qwen3.thinker_rows_part,
        "cuda_ipc_tests": lambda *_: {path.name: pytest_outcome(path)
                                      for path in CUDA_IPC_TESTS},
    }
    if name not in measures:
        raise ValueError(f"unknown part {name!r} (known: {', '.join(PARTS)})")
    return measures[name]


def snac_missing() -> str | None:
    """Why SNAC cannot be measured here (its package absent), or None."""
    try:
        import snac  # noqa: F401  # imported here only to see that it can be
    except ImportError as exc:
        return (f"not run: snac not installed ({exc}; carry it: "
                "agent/bench/gpu_torch_carry.sh)")
    return None


def print_estimate(plan: dict[str, Any]) -> None:
    """The estimate as a few lines."""
    print(f"estimate (meta device; time at an assumed {plan['assumed_tflops']:.0f} TFLOP/s "
          f"+ {plan['fixed_s']:.0f} s fixed): about {plan['seconds']:.0f} s, largest part "
          f"{plan['largest_part_gib']:.2f} GiB of weights")
    for name, row in plan["parts"].items():
        print(f"  {name:20} {row['parameters'] / 1e6:9.1f} M parameters {row['weight_gib']:7.2f} "
              f"GiB {row['tflop']:9.1f} TFLOP {row['seconds']:7.1f} s")


def print_report(result: dict[str, Any]) -> None:
    """The figures as a table: one line per level, utterance or prompt."""
    print(f"omnivox bench gpu-torch: size {result['size']} on {result['device']}, "
          f"{result['dtype']}, torch {result['torch']}, transformers {result['transformers']}")
    for name, row in result["parts"].items():
        header = {k: v for k, v in row.items() if not isinstance(v, list | dict)}
        print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in header.items()))
        for key in ("levels", "float32_levels", "utterances", "prompts", "reply_rows"):
            for line in row.get(key, []):
                print(f"  {key:14} " + ", ".join(f"{k} {v}" for k, v in line.items()))
        for test, outcome in row.items() if name == "cuda_ipc_tests" else ():
            print(f"  tests/{test}: {outcome}")
    print(f"forbidden modules imported: {result['forbidden_imported'] or 'none'}; "
          f"wall {result['wall_s']} s")


def _quiet_transformers() -> None:
    """Errors only from transformers: the real config's defaults warn about ids it never uses."""
    from transformers.utils import logging

    logging.set_verbosity_error()


def _device_name(device: Any) -> str:
    import torch

    return str(torch.cuda.get_device_name(device)) if device.type == "cuda" else "CPU"


def main(argv: list[str] | None = None) -> int:
    """`python -m agent.bench.gpu_torch`: the check without the omnivox command line."""
    parser = argparse.ArgumentParser(prog="python -m agent.bench.gpu_torch",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_flags(parser)
    return command(parser.parse_args(argv), None)


if __name__ == "__main__":
    sys.exit(main())
