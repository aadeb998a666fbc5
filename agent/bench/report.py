"""Printing benchmark figures for a person (with the targets beside them) and saving them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.bench.transport import FLAT_FROM, print_table, size_cost_ms

SHM_TARGET_RATIO = 20.0  # at 1 MiB
CASCADE_TARGET_RATIO = 3.0
FLAT_SHARE = 0.25  # of the product path from FLAT_FROM up: what the size may cost on it


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def print_pipeline_report(result: dict[str, Any]) -> None:
    """The `omnivox bench pipeline` figures as three small tables."""
    print("shared memory vs pickling through a pipe (one tensor, process to process)")
    print_table(result["shm_vs_pickle"], indent="  ")
    at_mib = [r for r in result["shm_vs_pickle"] if r["bytes"] == 1 << 20]
    if at_mib:
        ratio = at_mib[0]["inplace_ratio"]
        print(f"  target: the product path >= {SHM_TARGET_RATIO:.0f}x pickling at 1 MiB: "
              f"{ratio:.1f}x ({verdict(ratio >= SHM_TARGET_RATIO)})")
    if cost := size_cost_ms(result["shm_vs_pickle"]):
        # Judged on what size costs (the path less its control), within a share of the path
        # at its quickest (a noisy size widens no bound).
        bound = FLAT_SHARE * min(r["shm_inplace_s"] for r in result["shm_vs_pickle"]
                                 if r["bytes"] >= FLAT_FROM) * 1e3
        print(f"  target: flat from {FLAT_FROM >> 10} KiB up, the size's own cost within "
              f"+-{bound:.3f} ms: {cost[0]:+.3f} to {cost[1]:+.3f} ms "
              f"({verdict(max(map(abs, cost)) <= bound)})")
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
