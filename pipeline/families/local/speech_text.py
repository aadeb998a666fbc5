"""Reply text made speakable: markup and emoji removed, cut into phrases at clause punctuation.

A small model writes markdown and emoji now and then, however it is told; a phonemizer would
read them aloud ("asterisk asterisk"). Numbers, currency and percent signs stay: espeak-ng
speaks them as words itself.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")  # [text](url) -> text
_LINE_MARKUP = re.compile(r"^[ \t]*(?:#{1,6}|>+|[-*+•])[ \t]+", re.MULTILINE)
_INLINE_MARKUP = re.compile(r"\*+|_{2,}|(?<!\w)_|_(?!\w)|`+|~~|\|")  # emphasis, code, tables
_SPACES = re.compile(r"\s+")
# Clause punctuation followed by a space or the end: "3.5" and "e-mail" are not cut.
_CLAUSE_END = re.compile(r"([.,;:!?…]+)(?=\s|$)")
# Unicode categories that are never spoken: other symbols (emoji, dingbats), modifier symbols
# (skin tones), enclosing marks (keycaps), format characters (zero-width joiners), private
# use, surrogates.
_SILENT_CATEGORIES = frozenset({"So", "Sk", "Me", "Cf", "Co", "Cs"})
_VARIATION_SELECTORS = frozenset(range(0xFE00, 0xFE10))


@dataclass(frozen=True)
class Phrase:
    """One clause of speakable text and the punctuation that ends it ("" at the very end)."""

    text: str
    terminator: str = ""


def speakable(text: str) -> str:
    """`text` without markdown markup, emoji and runs of whitespace."""
    text = _LINK.sub(r"\1", text)
    text = _LINE_MARKUP.sub("", text)
    text = _INLINE_MARKUP.sub(" ", text)
    text = "".join(ch for ch in text if _spoken_char(ch))
    return _SPACES.sub(" ", text).strip()


def split_phrases(text: str) -> list[Phrase]:
    """Cut speakable text into phrases at clause punctuation; empty phrases are dropped."""
    phrases, start = [], 0
    for match in _CLAUSE_END.finditer(text):
        body = text[start:match.start()].strip()
        if body:
            phrases.append(Phrase(body, _terminator(match.group(1))))
        start = match.end()
    if rest := text[start:].strip():
        phrases.append(Phrase(rest))
    return phrases


def _terminator(marks: str) -> str:
    """One mark for a run of them, the strongest ("?!" asks; an ellipsis is a full stop)."""
    return next(mark for mark in "?!.;:," if mark in marks.replace("…", "."))


def _spoken_char(ch: str) -> bool:
    if ord(ch) in _VARIATION_SELECTORS:
        return False
    return unicodedata.category(ch) not in _SILENT_CATEGORIES
