"""The plots of `omnivox bench calls` (PNG, matplotlib's Agg backend: no display needed).

- latency_cdf.png: the distribution of time to first audio at each concurrency level (and of
  the sequential-stages run, dashed), beside that of the barge-in stop time;
- capacity.png: time to first audio (p50 and p95) and turns completed per second against the
  number of concurrent calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def plot_levels(result: dict[str, Any], directory: Path) -> list[Path]:
    """Draw both plots of a `bench calls` result into `directory`; their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only, whatever the environment's default backend
    directory.mkdir(parents=True, exist_ok=True)
    return [latency_cdf(result, directory / "latency_cdf.png"),
            capacity(result, directory / "capacity.png")]


def _cdf(axes: Any, values: list[float], **style: Any) -> None:
    if not values:
        return
    xs = np.sort(np.asarray(values, dtype=float))
    ys = np.arange(1, len(xs) + 1) / len(xs)
    # From 0 at the first value, so that a level with one sample still draws a step.
    axes.step(np.concatenate([xs[:1], xs]), np.concatenate([[0.0], ys]), where="post",
              **style)


def latency_cdf(result: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure, (ttfa, barge) = plt.subplots(1, 2, figsize=(11, 4.2))
    for level in result["levels"]:
        label = f"{level['concurrency']} call{'s' if level['concurrency'] > 1 else ''}"
        _cdf(ttfa, level["samples"]["ttfa_ms"], label=label)
        _cdf(barge, level["samples"]["barge_in_stop_ms"], label=label)
    sequential = result.get("sequential")
    if sequential:
        _cdf(ttfa, sequential["samples"]["ttfa_ms"], linestyle="--", color="black",
             label=f"{sequential['concurrency']}, sequential stages")
    silence = result["levels"][0].get("silence_ms")
    ttfa.set_title("time to first audio (end of speech -> first reply audio)")
    ttfa.set_xlabel("ms" + (f" (includes the {silence} ms end-of-turn silence)"
                            if silence else ""))
    barge.set_title("barge-in stop (caller's onset -> reply silent)")
    barge.set_xlabel("ms")
    for axes in (ttfa, barge):
        axes.set_ylabel("fraction of turns")
        axes.set_ylim(0, 1.02)
        axes.grid(alpha=0.3)
        if axes.has_data():
            axes.legend(fontsize="small")
        else:
            axes.text(0.5, 0.5, "no samples", ha="center", va="center",
                      transform=axes.transAxes)
    figure.suptitle(result.get("server_label", ""), fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def capacity(result: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    levels = sorted(result["levels"], key=lambda level: level["concurrency"])
    calls = [level["concurrency"] for level in levels]

    def series(key: str, stat: str) -> list[float]:
        return [np.nan if level[key][stat] is None else level[key][stat] for level in levels]

    figure, (latency, rate) = plt.subplots(1, 2, figsize=(11, 4.2))
    latency.plot(calls, series("ttfa_ms", "p50"), marker="o", label="p50")
    latency.plot(calls, series("ttfa_ms", "p95"), marker="o", label="p95")
    latency.plot(calls, series("ttfa_after_vad_ms", "p50"), marker="o", linestyle=":",
                 label="p50 after the end-of-turn silence")
    latency.set_title("time to first audio")
    latency.set_ylabel("ms")
    rate.plot(calls, [level["turns_per_s"] for level in levels], marker="o")
    rate.set_title("turns completed per second")
    rate.set_ylabel("turns/s")
    for axes in (latency, rate):
        axes.set_xscale("log", base=2)
        axes.set_xticks(calls, [str(c) for c in calls])
        axes.set_xlabel("concurrent calls")
        axes.grid(alpha=0.3)
    latency.legend(fontsize="small")
    figure.suptitle(result.get("server_label", ""), fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
