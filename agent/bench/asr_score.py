"""Word error rate of transcripts against references, after one text normalisation of both.

The normalisation: lower case; numbers written as words ("42" -> "forty two", "3.5" -> "three
point five", "6:30" -> "six thirty", "1,000" -> "one thousand"), "%" and "+" as "percent" and
"plus"; hyphens as spaces; every other mark but the apostrophe dropped (contractions stay as
said: "I'd" is not "I would"); the British spellings of the corpus as American ("colour" ->
"color"). The counting itself is jiwer's (edits over reference words, summed over a set).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import jiwer

from agent.bench.asr_corpus import Utterance

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
         "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = ((10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred"))
_SPELLING = {"colour": "color", "colours": "colors", "favourite": "favorite",
             "favourites": "favorites", "okay": "ok"}
_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")


def number_words(n: int) -> str:
    """A whole number in words, as said in English ("one hundred twenty three")."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    for size, name in _SCALES:
        if n >= size:
            rest = n % size
            return f"{number_words(n // size)} {name}" + (f" {number_words(rest)}" if rest else "")
    raise AssertionError("unreachable")  # every n >= 100 has a scale


def _spoken_number(match: re.Match[str]) -> str:
    whole, _, fraction = match.group().replace(",", "").partition(".")
    words = number_words(int(whole))
    if fraction:
        words += " point " + " ".join(_ONES[int(d)] for d in fraction)
    return f" {words} "


def normalise(text: str) -> str:
    """`text` normalised for scoring (see the module's docstring)."""
    text = text.lower().replace("%", " percent ").replace("+", " plus ")
    text = _NUMBER.sub(_spoken_number, text)
    text = re.sub(r"[^a-z' ]+", " ", text.replace("-", " "))
    words = (word.strip("'") for word in text.split())
    return " ".join(_SPELLING.get(word, word) for word in words if word)


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Edits over reference words, summed over all pairs (0 for a perfect set)."""
    refs = [normalise(r) for r in references]
    hyps = [normalise(h) for h in hypotheses]
    return float(jiwer.wer(refs, hyps))


@dataclass(frozen=True)
class Heard:
    """What the recogniser wrote down for one utterance, and what it cost."""

    utterance: Utterance
    text: str
    wall_ms: float
    cpu_ms: float
    mean_log_prob: float  # the decoder's confidence in `text` (asr_confidence.py)

    @property
    def right(self) -> bool:
        return normalise(self.text) == normalise(self.utterance.text)
