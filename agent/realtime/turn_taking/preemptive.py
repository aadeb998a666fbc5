"""A preemptive reply: the turn started when the caller pauses, before the end-of-turn silence
says the utterance is over.

Its pipeline events are held, never played or shown, until the turn is confirmed: the session
then runs its reply on them (the engines are already under way) when the turn it would start
now is the very one this started (same audio, history, voice and options); when the caller goes
on speaking, or anything else changed, it is discarded and every request of it aborted in every
engine, as a barge-in aborts a reply.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import numpy as np

from pipeline.turns.events import Transcript, Turn

# Events held before the turn is confirmed: a few hundred ms of the pipeline's output (text
# deltas and audio chunks). Past this the pump waits, as a slow reply's playback makes it.
HELD_EVENTS = 256
_END = object()


class PreemptiveReply:
    """One speculative turn in the pipeline, its events held in a bounded queue."""

    def __init__(self, pipeline: Any, turn: Turn,
                 on_transcript: Callable[[PreemptiveReply, Transcript], None] | None = None,
                 ) -> None:
        self.pipeline, self.turn = pipeline, turn
        # Told of the caller's words as soon as they are heard, while the events wait: the
        # session judges the end of the turn on them (semantic_turns.py)
        self._on_transcript = on_transcript
        self._events: asyncio.Queue[Any] = asyncio.Queue(HELD_EVENTS)
        self._error: BaseException | None = None
        self._pump = asyncio.ensure_future(self._run())

    def serves(self, turn: Turn) -> bool:
        """Whether `turn` (bar its id) is the turn this one started."""
        mine, theirs = self.turn.audio, turn.audio
        same_audio = (mine is None and theirs is None) or (
            mine is not None and theirs is not None and np.array_equal(mine, theirs))
        # Arrays do not compare as one value: the rest of the turn does, without them.
        return same_audio and replace(turn, turn_id=self.turn.turn_id, audio=None) == replace(
            self.turn, audio=None)

    async def events(self) -> AsyncIterator[Any]:
        """The turn's events: those held so far, then the rest as they come."""
        while (event := await self._events.get()) is not _END:
            yield event
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        """Stop holding events (the reply reading them ended; its aborts are its own)."""
        self._pump.cancel()

    async def discard(self) -> None:
        """Abort every request of the turn; nothing of it was played or kept."""
        await self.pipeline.cancel(self.turn.turn_id)
        self.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump

    async def _run(self) -> None:
        try:
            async for event in self.pipeline.respond(self.turn):
                if isinstance(event, Transcript) and self._on_transcript is not None:
                    self._on_transcript(self, event)
                await self._events.put(event)
        except asyncio.CancelledError:
            raise  # discarded: nobody reads on
        except Exception as exc:  # the reader raises it where the reply would have
            self._error = exc
        await self._events.put(_END)
