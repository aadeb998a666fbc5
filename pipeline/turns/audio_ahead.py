"""How far a turn's rendered audio runs ahead of the caller, when the next chunk must be cut
early so that the caller does not run dry.

The caller hears a reply in real time from its first audio on, so the audio rendered so far
runs out at `first audio + seconds rendered`. Voicing a chunk (Talker, then VoiceBox) takes a
while after its cut, longer on a busy machine: measured per chunk, from its cut to its first
audio; the longest of the turn so far counts. Once the audio ahead is less than `factor` times
that delay, waiting for the end of a clause would leave the caller in silence: the chunker is
told to hurry (cut like a first chunk). On a fast machine the audio ahead stays long and
chunks keep their clause cuts.

The first audio is never held back to wait for the Thinker: a late start is worse than a short
pause mid-reply. What keeps the caller from running dry instead is a small first group of
speech tokens that grows (TalkerJob.next_group) and, once running low, chunks cut early and
voiced from a small group again (pipeline/turns/turn.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class AudioAhead:
    """One turn's rendered audio against the caller's clock; `running_low()` says hurry."""

    def __init__(self, factor: float | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.factor = factor
        self._clock = clock
        self._cut_at: dict[int, float] = {}  # chunk index -> when it was cut
        self._first_audio_at: float | None = None
        self._rendered_s = 0.0
        # The longest delay of a chunk from its cut to its first audio in this turn: the first
        # chunk's is short (a small first group), later ones' longer (tiny: 0.08 s, then 0.27).
        self._voicing_s = 0.0
        self.lowest_ahead_s: float | None = None  # just before audio came (negative: ran dry)

    def cut(self, index: int) -> None:
        """Chunk `index` has gone to the Talker."""
        self._cut_at[index] = self._clock()

    def rendered(self, index: int, seconds: float) -> None:
        """`seconds` of chunk `index`'s audio have been rendered (and go to the caller)."""
        now = self._clock()
        cut_at = self._cut_at.pop(index, None)
        if cut_at is not None:  # its first audio
            self._voicing_s = max(self._voicing_s, now - cut_at)
        if self._first_audio_at is None:
            self._first_audio_at = now
        else:
            ahead = self._first_audio_at + self._rendered_s - now
            if self.lowest_ahead_s is None or ahead < self.lowest_ahead_s:
                self.lowest_ahead_s = ahead
        self._rendered_s += seconds

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
