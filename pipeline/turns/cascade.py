"""The cascade's text chunker: Thinker text pieces -> Talker chunks cut at clause boundaries.

Chunks are cut only between pieces (Thinker deltas), so each chunk's token ids and embeddings
are exactly those of its text. A cut after clause punctuation waits for the next piece to start
with whitespace ("3.5" and "e.g" stay whole). The first chunk is short (a fast first audio):
it ends at the first clause or at the first word past `first_chars`; later chunks end at a
clause past `min_chars`, or at a word past `max_chars`. Chunks tile the reply exactly:
reply[chunk.start:chunk.end] == chunk.text.

With `growth`, a later chunk is also cut at a word once it is `growth` times as long as all the
text before it (never below `min_chars`). For a Thinker that writes only a few times faster
than speech is spoken, this keeps each chunk's text written and voiced while the audio of the
text before it plays: waiting for the end of a long clause would leave the caller in silence.
A piece fed with `hurry` (the caller is about to run dry: audio_ahead.py) cuts a later chunk
like a first one, at the first clause or at a word past `first_chars`.

Embeddings that came as arrays are joined per chunk; CUDA IPC exports (which the API process
cannot read) are kept in the chunk as they are, in order, for the Talker job to carry.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from pipeline.tensors.cuda_ipc import CudaIpcRef

CLAUSE_END = frozenset(".,;:!?…")
FULLWIDTH_CLAUSE_END = frozenset("。，、；：！？")  # scripts without spaces: cut right after these


@dataclass(frozen=True)
class Piece:
    """One Thinker delta: its text, token ids and (if the family makes them) embeddings."""

    text: str
    token_ids: tuple[int, ...] = ()
    # (len(token_ids), hidden) in pieces along dim 0: arrays, or CUDA IPC exports of them
    # (read only by the Talker); empty: none
    embeds: tuple[np.ndarray | CudaIpcRef, ...] = ()
    prompt_rows: int = 0  # leading rows of embeds that are the Thinker's prompt part


@dataclass(frozen=True)
class Chunk:
    """One Talker chunk: reply[start:end] == text, with its tokens' ids and embeddings."""

    index: int
    text: str
    start: int
    end: int
    token_ids: tuple[int, ...]
    # The tokens' embeddings in order: arrays of consecutive pieces joined into one, CUDA IPC
    # exports as they came (joined along dim 0 by the Talker).
    parts: tuple[np.ndarray | CudaIpcRef, ...] = ()
    prompt_rows: int = 0  # leading rows of the parts that are the Thinker's prompt part
    last: bool = False  # the reply's last chunk (a closing flush marks it)

    @property
    def embeds(self) -> np.ndarray | None:
        """All the chunk's embeddings as one array, when they all came as arrays."""
        if len(self.parts) == 1 and isinstance(self.parts[0], np.ndarray):
            return self.parts[0]
        return None


class ClauseChunker:
    """Cuts a stream of pieces into chunks; `feed` each piece, then `flush` the rest."""

    def __init__(self, first_chars: int = 16, min_chars: int = 24, max_chars: int = 160,
                 growth: float | None = None) -> None:
        self.first_chars, self.min_chars, self.max_chars = first_chars, min_chars, max_chars
        self.growth = growth
        self._pieces: list[Piece] = []
        self._text = ""  # the pending pieces' text
        self._start = 0
        self._index = 0

    def feed(self, piece: Piece, hurry: bool = False) -> Chunk | None:
        """Add a piece; the chunk that ends before it, if the cut falls there (`hurry`: the
        first clause or word past `first_chars` will do)."""
        cut = bool(self._text) and self._cuts_before(piece.text, hurry)
        chunk = self._cut() if cut else None
        self._pieces.append(piece)
        self._text += piece.text
        return chunk

    def flush(self, closing: bool = False) -> Chunk | None:
        """The last chunk (at the end of the reply), if any text is pending. `closing`: always
        one, marked last, even with no text (its pieces' rows, a stop token's, still count)."""
        if closing:
            return dataclasses.replace(self._cut(), last=True)
        return self._cut() if self._text.strip() else None

    def _cuts_before(self, following: str, hurry: bool) -> bool:
        """Whether the pending text ends a chunk, given the text of the next piece."""
        text = self._text
        if not text.strip():
            return False  # whitespace alone is nothing to voice: it joins the next chunk
        word_break = text[-1].isspace() or following[:1].isspace()
        tail = text.rstrip()[-1:]
        clause = (tail in CLAUSE_END and word_break) or tail in FULLWIDTH_CLAUSE_END
        clause = clause or text.endswith("\n")
        if self._index == 0 or hurry:
            return clause or (word_break and len(text) >= self.first_chars)
        if clause and len(text) >= self.min_chars:
            return True
        return (word_break and len(text) >= self._word_cut_chars()) or (
            len(text) >= 2 * self.max_chars)

    def _word_cut_chars(self) -> int:
        """The length past which a later chunk is cut at a word, clause or not."""
        if self.growth is None:
            return self.max_chars
        return min(self.max_chars, max(self.min_chars, int(self.growth * self._start)))

    def _cut(self) -> Chunk:
        pieces, text = self._pieces, self._text
        chunk = Chunk(
            index=self._index,
            text=text,
            start=self._start,
            end=self._start + len(text),
            token_ids=tuple(t for p in pieces for t in p.token_ids),
            parts=_join_arrays(pieces),
            prompt_rows=sum(p.prompt_rows for p in pieces),
        )
        self._pieces, self._text = [], ""
        self._start, self._index = chunk.end, self._index + 1
        return chunk


def _join_arrays(pieces: list[Piece]) -> tuple[np.ndarray | CudaIpcRef, ...]:
    """The pieces' embeddings in order, each run of arrays joined into one (one copy)."""
    parts: list[np.ndarray | CudaIpcRef] = []
    run: list[np.ndarray] = []
    for part in (part for piece in pieces for part in piece.embeds):
        if isinstance(part, CudaIpcRef):
            if run:
                parts.append(np.concatenate(run))
                run = []
            parts.append(part)
        elif len(part):
            run.append(part)
    if run:
        parts.append(np.concatenate(run))
    return tuple(parts)
