"""Keyword scoring of `omnivox bench answers`: whether an answer is right, and the figures per
category (share right, median answer latency)."""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from agent.bench.answer_set import Question
from pipeline.families.local.thinker import ASK_AGAIN


def words(text: str) -> str:
    """Lower case, typographic apostrophes made plain, other punctuation dropped, single
    spaces, with a space at each end so that a keyword matches whole words only."""
    plain = text.lower().replace("\u2019", "'")
    return " " + " ".join(re.sub(r"[^a-z0-9' ]+", " ", plain).split()) + " "


def holds(answer: str, keyword: str) -> bool:
    """Whether `keyword` (a word or a phrase) occurs in `answer` as whole words."""
    return words(keyword) in words(answer)


def is_right(question: Question, answer: str) -> bool:
    """Right: one of `any_of` (when there are any), all of `all_of`, none of `none_of`."""
    return ((not question.any_of or any(holds(answer, k) for k in question.any_of))
            and all(holds(answer, k) for k in question.all_of)
            and not any(holds(answer, k) for k in question.none_of))


@dataclass(frozen=True)
class Answered:
    """One question asked: what was heard (the question itself when typed), the answer, and
    the milliseconds from asking to the whole answer."""

    question: Question
    heard: str
    answer: str
    latency_ms: float

    @property
    def right(self) -> bool:
        return is_right(self.question, self.answer)

    @property
    def asked_again(self) -> bool:
        """The Thinker was unsure of what it heard and asked for the question again."""
        return self.answer == ASK_AGAIN


@dataclass(frozen=True)
class Tally:
    """A group of answers: how many, how many right, how many asked again instead, and their
    median latency."""

    name: str
    count: int
    right: int
    asked_again: int
    median_ms: float

    @property
    def accuracy(self) -> float:
        return self.right / self.count if self.count else 0.0


def tally(name: str, answered: Sequence[Answered]) -> Tally:
    latencies = [a.latency_ms for a in answered]
    return Tally(name, len(answered), sum(a.right for a in answered),
                 sum(a.asked_again for a in answered),
                 statistics.median(latencies) if latencies else 0.0)


def by_category(answered: Sequence[Answered]) -> list[Tally]:
    """One tally per category in the set's order, then "all"."""
    categories = dict.fromkeys(a.question.category for a in answered)
    return [*(tally(c, [a for a in answered if a.question.category == c]) for c in categories),
            tally("all", answered)]
