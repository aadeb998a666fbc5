"""Printing benchmark figures for a person (with the targets beside them) and saving them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SHM_TARGET_RATIO = 20.0  # at 1 MiB
CASCADE_TARGET_RATIO = 3.0


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def print_pipeline_report(result: dict[str, Any]) -> None:
    """The `omnivox bench pipeline` figures as three small tables."""
    print("shared memory vs pickling through a pipe (one tensor, process to process)")
    # The product's path: the producer computes into a leased block, the consumer reads a view.
    print(f"  {'bytes':>10} {'product path ms':>16} {'pickle ms':>10} {'ratio':>7} "
          f"{'copy into a block ms':>21} {'ratio':>7}")
    for row in result["shm_vs_pickle"]:
        print(f"  {row['bytes']:>10} {row['shm_inplace_s'] * 1e3:>16.3f} "
              f"{row['pickle_s'] * 1e3:>10.3f} {row['inplace_ratio']:>7.1f} "
              f"{row['shm_s'] * 1e3:>21.3f} {row['ratio']:>7.1f}")
    at_mib = [r for r in result["shm_vs_pickle"] if r["bytes"] == 1 << 20]
    if at_mib:
        ratio = at_mib[0]["inplace_ratio"]
        print(f"  target: the product path >= {SHM_TARGET_RATIO:.0f}x pickling at 1 MiB: "
              f"{ratio:.1f}x ({verdict(ratio >= SHM_TARGET_RATIO)})")
    c = result["cascade_vs_sequential"]
    print(f"\ncascade vs sequential, {c['reply_tokens']}-token reply, first audio")
    print(f"  cascade {c['cascade_first_audio_s'] * 1e3:.0f} ms, sequential "
          f"{c['sequential_first_audio_s'] * 1e3:.0f} ms: {c['ratio']:.1f}x sooner "
          f"(target >= {CASCADE_TARGET_RATIO:.0f}x: {verdict(c['ratio'] >= CASCADE_TARGET_RATIO)})")
    print("\nconcurrent turns")
    print(f"  {'turns':>6} {'turns/s':>8} {'median first audio ms':>22}")
    for row in result["concurrency"]:
        print(f"  {row['turns']:>6} {row['turns_per_s']:>8.2f} "
              f"{row['median_first_audio_s'] * 1e3:>22.0f}")


def write_json(path: str | Path, result: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nfigures written to {path}")
