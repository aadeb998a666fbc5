"""The bench caller's voice: a paced 16 kHz microphone track and the utterances said through it,
timed on the media timeline."""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Callable
from dataclasses import dataclass

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from agent.bench.speech import MIC_RATE

MIC_FRAME = MIC_RATE // 50  # 20 ms
MAX_LAG_S = 0.1  # a microphone this far behind its clock (a starved loop) re-anchors


@dataclass
class Utterance:
    """Something the caller said: when it started and ended on the media timeline."""

    samples: int  # at MIC_RATE
    onset: float | None = None
    end: float | None = None

    @property
    def padding_s(self) -> float:
        """Silence that fills out the utterance's last 20 ms frame."""
        return (-self.samples % MIC_FRAME) / MIC_RATE


class FrameClock:
    """An absolute 20 ms clock: frame n is due at start + n * 20 ms; a clock this far behind
    (a starved loop) re-anchors rather than sending a burst."""

    def __init__(self) -> None:
        self._start: float | None = None
        self.index = 0
        # When the current frame was due (monotonic): where it lies on the media timeline. A
        # frame sent late (a busy loop) is still due then, and the server cannot have it
        # sooner: an utterance's edges are stamped with this, never with when it was sent.
        self.due = 0.0

    async def tick(self) -> int:
        """Wait for the next frame's time; its index."""
        now = time.monotonic()
        if self._start is None:
            self._start = self.due = now
            return self.index
        self.index += 1
        self.due = self._start + self.index * 0.02
        if now - self.due > MAX_LAG_S:
            self._start, self.due = now - self.index * 0.02, now
        elif self.due > now:
            await asyncio.sleep(self.due - now)
        return self.index


class Microphone(MediaStreamTrack):
    """The caller's voice as an aiortc track: 20 ms frames of 16 kHz mono on an absolute clock,
    the utterance being said or silence; `on_edge(True/False, at)` when speech starts or ends,
    `at` the edge's frame's due time (FrameClock.due)."""

    kind = "audio"

    def __init__(self, on_edge: Callable[[bool, float], None]) -> None:
        super().__init__()
        self.on_edge = on_edge
        self._pending = np.zeros(0, np.int16)
        self._speaking = False
        self._clock = FrameClock()

    def say(self, pcm: np.ndarray) -> None:
        """Say `pcm` (16 kHz) from the next frame on, after whatever is still being said."""
        self._pending = np.concatenate([self._pending, pcm.astype(np.int16)])

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        index = await self._clock.tick()
        chunk, self._pending = self._pending[:MIC_FRAME], self._pending[MIC_FRAME:]
        if chunk.size and not self._speaking:
            self._speaking = True
            self.on_edge(True, self._clock.due)
        elif not chunk.size and self._speaking:
            self._speaking = False
            self.on_edge(False, self._clock.due)
        if chunk.size < MIC_FRAME:
            chunk = np.pad(chunk, (0, MIC_FRAME - chunk.size))
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = MIC_RATE
        frame.pts = index * MIC_FRAME
        frame.time_base = fractions.Fraction(1, MIC_RATE)
        return frame
