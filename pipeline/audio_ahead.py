"""How far a turn's rendered audio runs ahead of the caller, when the next chunk must be cut
early so that the caller does not run dry, and how long the first audio should wait.

The caller hears a reply in real time from its first audio on, so the audio rendered so far
runs out at `first audio + seconds rendered`. Voicing a chunk (Talker, then VoiceBox) takes a
while after its cut, longer on a busy machine: measured per chunk, from its cut to its first
audio; the longest of the turn so far counts. Once the audio ahead is less than `factor` times
that delay, waiting for the end of a clause would leave the caller in silence: the chunker is
told to hurry (cut like a first chunk). On a fast machine the audio ahead stays long and
chunks keep their clause cuts.

Hurrying cannot help while the Thinker has not written the next chunk's words yet. So when the
first audio arrives, the next chunk's first audio is foreseen: the Thinker writes `next_chars`
more characters at the pace it has kept so far, then the chunk takes `factor` times the first
one's delay. Where that comes after the first audio runs out, the first audio waits for the
difference (at most `max_hold_s`): a slower start rather than a gap in the reply. On a fast
machine it does not wait at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class AudioAhead:
    """One turn's rendered audio against the caller's clock; `running_low()` says hurry."""

    def __init__(self, factor: float | None, next_chars: int = 16, max_hold_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.factor, self.next_chars, self.max_hold_s = factor, next_chars, max_hold_s
        self._clock = clock
        self._cut_at: dict[int, float] = {}  # chunk index -> when it was cut
        self._first_text_at: float | None = None
        self._written = self._first_written = self._cut_end = 0  # characters of reply text
        self._writing = True
        self._first_audio_at: float | None = None
        self._rendered_s = 0.0
        # The longest delay of a chunk from its cut to its first audio in this turn: the first
        # chunk's is short (a small first group), later ones' longer (tiny: 0.08 s, then 0.27).
        self._voicing_s = 0.0
        self.lowest_ahead_s: float | None = None  # just before audio came (negative: ran dry)

    def wrote(self, chars: int) -> None:
        """The Thinker wrote `chars` more characters of the reply."""
        if self._first_text_at is None:
            self._first_text_at, self._first_written = self._clock(), chars
        self._written += chars

    def finished_writing(self) -> None:
        """The Thinker's reply is complete: no chunk waits for its words any more."""
        self._writing = False

    def cut(self, index: int, end: int) -> None:
        """Chunk `index`, the reply's text up to character `end`, has gone to the Talker."""
        self._cut_at[index] = self._clock()
        self._cut_end = end

    def rendered(self, index: int, seconds: float) -> float:
        """`seconds` of chunk `index`'s audio have been rendered; how long to hold them back
        before they play (only ever more than 0 for the turn's first audio)."""
        now = self._clock()
        cut_at = self._cut_at.pop(index, None)
        if cut_at is not None:  # its first audio
            self._voicing_s = max(self._voicing_s, now - cut_at)
        hold = 0.0
        if self._first_audio_at is None:
            hold = self._hold_s(now, seconds)
            self._first_audio_at = now + hold
        else:
            ahead = self._first_audio_at + self._rendered_s - now
            if self.lowest_ahead_s is None or ahead < self.lowest_ahead_s:
                self.lowest_ahead_s = ahead
        self._rendered_s += seconds
        return hold

    def _hold_s(self, now: float, seconds: float) -> float:
        """How much later the next chunk's first audio is foreseen than the end of `seconds`
        of first audio (0 when on time or unforeseeable), at most `max_hold_s`."""
        if self.factor is None or not self._writing or self._first_text_at is None:
            return 0.0
        pace = (self._written - self._first_written) / max(now - self._first_text_at, 1e-3)
        missing = max(0, self.next_chars - (self._written - self._cut_end))
        if missing and pace <= 0:
            return 0.0  # no pace yet: it has written nothing since its first piece
        next_audio = now + (missing / pace if missing else 0.0) + self.factor * self._voicing_s
        return min(self.max_hold_s, max(0.0, next_audio - (now + seconds)))

    def ahead_s(self) -> float | None:
        """Seconds of rendered audio the caller has not heard yet (negative: it ran dry);
        None before the first audio."""
        if self._first_audio_at is None:
            return None
        return self._first_audio_at + self._rendered_s - self._clock()

    def running_low(self) -> bool:
        """Whether the audio ahead is shorter than `factor` times the longest chunk delay."""
        ahead = self.ahead_s()
        if self.factor is None or ahead is None:
            return False
        return ahead < self.factor * self._voicing_s
