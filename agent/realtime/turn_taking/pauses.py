"""What a session does at the caller's pauses (vad.pause_ms): the reply's turn is started there
and held as a preemptive reply (preemptive.py) until the end of the turn confirms it; under
semantic_vad the Thinker's judgement of the words heard so far may end the turn at the pause
(semantic_turns.py); the caller going on, or another turn taken, discards it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import numpy as np

from agent.ops.logs import context as log_context
from agent.ops.metrics import Metrics
from agent.realtime.turn_taking.preemptive import PreemptiveReply
from agent.realtime.turn_taking.semantic_turns import SemanticTurns
from media.vad import SpeechPaused
from pipeline.turns.events import Transcript, Turn

log = logging.getLogger(__name__)


class TurnSource(Protocol):
    """What starting a reply at a pause needs of the conversation: the turn its reply would
    run if the utterance ended now, and the pipeline to start it on."""

    @property
    def pipeline(self) -> Any: ...

    def turn_at_pause(self, pcm: np.ndarray) -> Turn | None:
        """The turn that would answer `pcm` were it the caller's whole turn; None when no reply
        would start at its end."""
        ...


class Pauses:
    """The session's preemptive reply: at most one, started at a pause."""

    def __init__(self, source: TurnSource, judge: SemanticTurns, metrics: Metrics,
                 spawn: Callable[[Coroutine[Any, Any, None]], None], call_id: str) -> None:
        self._source, self._judge = source, judge
        self._metrics, self._spawn, self._call_id = metrics, spawn, call_id
        self.preemptive: PreemptiveReply | None = None

    def paused(self, event: SpeechPaused) -> None:
        """The caller paused: when a reply would start on this utterance if the pause turned
        out to end it, start its turn now and hold what it makes until the turn is confirmed."""
        if self.preemptive is not None:
            return
        turn = self._source.turn_at_pause(event.pcm)
        if turn is None:
            return
        with log_context(turn_id=turn.turn_id):
            self.preemptive = PreemptiveReply(self._source.pipeline, turn, self._heard)
        self._metrics.preemptive_replies.labels("started").inc()
        log.debug("call %s: preemptive turn %s at a pause %d ms into the utterance",
                  self._call_id, turn.turn_id, event.audio_end_ms - event.audio_start_ms)

    def _heard(self, preemptive: PreemptiveReply, heard: Transcript) -> None:
        """The caller's words at the pause of the preemptive reply still held: judged
        (semantic_vad), which may end the turn here."""
        if preemptive is self.preemptive:
            self._judge.judge(heard)

    def take(self, turn: Turn) -> PreemptiveReply | None:
        """The preemptive reply already running `turn` (the same audio, history, voice and
        options), now the session's to run on; None when there is none, and any other is
        discarded."""
        preemptive = self.preemptive
        if preemptive is not None and preemptive.serves(turn):
            self.preemptive = None
            self._metrics.preemptive_replies.labels("used").inc()
            return preemptive
        self.discard()
        return None

    def discard(self) -> None:
        """The turn started at the pause is not wanted: its requests are aborted."""
        preemptive, self.preemptive = self.preemptive, None
        if preemptive is not None:
            self._metrics.preemptive_replies.labels("discarded").inc()
            with log_context(turn_id=preemptive.turn.turn_id):
                self._spawn(preemptive.discard())

    async def aclose(self) -> None:
        """The call ended: a turn started at a pause is aborted before the call's end."""
        preemptive, self.preemptive = self.preemptive, None
        if preemptive is not None:
            await preemptive.discard()
