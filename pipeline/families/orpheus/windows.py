"""Streaming SNAC decode windows: which frames each VoiceBox job voices, with what context.

SNAC's decoder is convolutional and looks both ways, so a piece of audio decoded alone differs
from the same piece of one full decode near its edges. Each window therefore carries `context`
frames before the frames it voices and `lookahead` frames after them, and the VoiceBox keeps
only the audio of the voiced frames. With CONTEXT = LOOKAHEAD = 3 the windows' audio equals
one full decode to float precision (tests/test_orpheus_snac.py measures it); the first window
voices the first frame at once, before any lookahead exists (first audio after 7 tokens), and
the last window of an utterance needs none (the full decode ends there too).

A window travels as a VoiceBox job's tokens: `[context, lookahead, *codes]`, 7 codes a frame,
so the VoiceBox keeps no state between jobs.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.families.orpheus.codes import FRAME

CONTEXT = 3  # frames of left context per window
LOOKAHEAD = 3  # frames of lookahead per window
HEADER = 2  # tokens before a window's codes: context, lookahead


@dataclass(frozen=True)
class Window:
    """Frames to decode together; the voiced ones are those between context and lookahead."""

    frames: list[list[int]]
    context: int
    lookahead: int

    @property
    def voiced(self) -> int:
        """How many frames of this window are voiced."""
        return len(self.frames) - self.context - self.lookahead

    def tokens(self) -> list[int]:
        """The window as a VoiceBox job's tokens."""
        return [self.context, self.lookahead, *(code for frame in self.frames for code in frame)]

    @classmethod
    def of_tokens(cls, tokens: list[int]) -> Window:
        """The window a VoiceBox job's tokens carry (a clear error if malformed)."""
        if len(tokens) < HEADER:
            raise ValueError(f"not a SNAC window: {len(tokens)} tokens")
        context, lookahead, codes = tokens[0], tokens[1], tokens[HEADER:]
        if len(codes) % FRAME or context < 0 or lookahead < 0 \
                or context + lookahead >= len(codes) // FRAME:
            raise ValueError(f"not a SNAC window: context {context}, lookahead {lookahead}, "
                             f"{len(codes)} codes")
        frames = [codes[i:i + FRAME] for i in range(0, len(codes), FRAME)]
        return cls(frames, context, lookahead)


class WindowCutter:
    """Cuts one utterance's frames, as they arrive, into windows to voice in order."""

    def __init__(self, group: int, first: int = 1, context: int = CONTEXT,
                 lookahead: int = LOOKAHEAD) -> None:
        self.group, self.first = max(1, group), max(1, first)
        self.context, self.lookahead = context, lookahead
        self.frames: list[list[int]] = []
        self.done = 0  # frames voiced so far

    def add(self, frames: list[list[int]]) -> list[Window]:
        """The windows ready once these frames have arrived."""
        self.frames.extend(frames)
        windows = []
        if self.done == 0 and len(self.frames) >= self.first:
            # first audio as early as possible: whatever lookahead there is (usually none)
            end = self.first
            windows.append(self._window(end, min(self.lookahead, len(self.frames) - end)))
        while self.done and len(self.frames) >= self.done + self.group + self.lookahead:
            windows.append(self._window(self.done + self.group, self.lookahead))
        return windows

    def finish(self) -> list[Window]:
        """The window voicing what is left at the utterance's end (none if nothing is)."""
        if self.done == len(self.frames):
            return []
        return [self._window(len(self.frames), 0)]

    def _window(self, end: int, lookahead: int) -> Window:
        """Voice frames [done, end), with the context there is and `lookahead` frames after."""
        start = max(0, self.done - self.context)
        window = Window(self.frames[start:end + lookahead], self.done - start, lookahead)
        self.done = end
        return window
