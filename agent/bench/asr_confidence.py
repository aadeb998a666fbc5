"""How well the recognizer's confidence tells a misheard utterance from one heard right: the
figures behind the local family's `ask_again_below` (asking the caller to repeat rather than
answering words it probably misheard).

For each threshold on the decoder's mean token log-probability, per condition of the corpus's
questions: how many utterances would be asked again, how many of the misheard ones that
catches, how many heard right it asks again needlessly, and the word error rate of the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent.bench.asr_score import Heard, word_error_rate

THRESHOLDS = (-0.3, -0.4, -0.5, -0.65, -0.8, -1.0)


def asking_again(heard: Sequence[Heard],
                 thresholds: Sequence[float] = THRESHOLDS) -> dict[str, list[dict[str, Any]]]:
    """Per condition of the questions ("clean", "noisy"), one row per threshold."""
    conditions = sorted({h.utterance.condition for h in heard if h.utterance.kind == "question"})
    return {condition: [_row([h for h in heard if h.utterance.kind == "question"
                              and h.utterance.condition == condition], threshold)
                        for threshold in thresholds]
            for condition in conditions}


def _row(group: Sequence[Heard], threshold: float) -> dict[str, Any]:
    asked = [h for h in group if h.mean_log_prob < threshold]
    kept = [h for h in group if h.mean_log_prob >= threshold]
    misheard = [h for h in group if not h.right]
    return {
        "below": threshold,
        "asked": _share(len(asked), len(group)),
        "misheard_caught": _share(sum(not h.right for h in asked), len(misheard)),
        "right_asked": _share(sum(h.right for h in asked), len(group) - len(misheard)),
        "wer_answered": round(word_error_rate([h.utterance.text for h in kept],
                                              [h.text for h in kept]), 4) if kept else None,
    }


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 3) if whole else None


def print_asking_again(result: dict[str, Any]) -> None:
    """The table of one configuration's `asking_again` figures."""
    print(f"\nasking again below a mean log-probability, {result['config']}")
    print(f"{'condition':<10} {'below':>6} {'asked':>6} {'misheard caught':>16} "
          f"{'right asked':>12} {'WER answered':>13}")
    for condition, rows in result["asking_again"].items():
        for row in rows:
            print(f"{condition:<10} {row['below']:6.2f} {_cell(row['asked'])} "
                  f"{_cell(row['misheard_caught'], 16)} {_cell(row['right_asked'], 12)} "
                  f"{_cell(row['wer_answered'], 13)}")


def _cell(value: float | None, width: int = 6) -> str:
    return f"{value:{width}.3f}" if value is not None else f"{'-':>{width}}"
