"""What a session does at the caller's pauses (vad.pause_ms): the reply's turn is started there
and held as a preemptive reply (preemptive.py) until the end of the turn confirms it; under
semantic_vad the Thinker's judgement of the words heard so far may end the turn at the pause
(semantic_turns.py); the caller going on, or another turn taken, discards it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent.ops.logs import context as log_context
from agent.realtime.preemptive import PreemptiveReply
from agent.realtime.semantic_turns import ends_turn
from media.vad import SpeechPaused
from pipeline.events import Transcript, Turn

if TYPE_CHECKING:
    from agent.realtime.session import Session

log = logging.getLogger(__name__)


class Pauses:
    """The session's preemptive reply: at most one, started at a pause."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.preemptive: PreemptiveReply | None = None

    def paused(self, event: SpeechPaused) -> None:
        """The caller paused: when a reply would start on this utterance if the pause turned
        out to end it, start its turn now and hold what it makes until the turn is confirmed."""
        session = self.session
        if self.preemptive is not None or not session.answers_at_end_of_turn():
            return
        turn = session.next_turn(event.pcm, session.settings.text_only, session.tools)
        with log_context(turn_id=turn.turn_id):
            self.preemptive = PreemptiveReply(session.pipeline, turn, self._judge)
        session.call.metrics.preemptive_replies.labels("started").inc()
        log.debug("call %s: preemptive turn %s at a %d ms pause", session.call.id,
                  turn.turn_id, session.call.vad.config.pause_ms)

    def _judge(self, preemptive: PreemptiveReply, heard: Transcript) -> None:
        """semantic_vad: end the turn at this pause when the Thinker scored the caller's words
        as a whole turn (its reply is then the one under way), else let the silence decide."""
        call, eagerness = self.session.call, self.session.settings.eagerness
        if eagerness is None or preemptive is not self.preemptive:
            return
        ended = ends_turn(eagerness, heard.end_of_turn) and call.end_utterance()
        call.metrics.semantic_turn_ends.labels("ended" if ended else "waited").inc()
        log.info("call %s: %r scored %s as a whole turn: %s", call.id, heard.text,
                 "unscored" if heard.end_of_turn is None else f"{heard.end_of_turn:.2f}",
                 "turn ended at the pause" if ended else "waiting")

    def take(self, turn: Turn) -> PreemptiveReply | None:
        """The preemptive reply already running `turn` (the same audio, history, voice and
        options), now the session's to run on; None when there is none, and any other is
        discarded."""
        preemptive = self.preemptive
        if preemptive is not None and preemptive.serves(turn):
            self.preemptive = None
            self.session.call.metrics.preemptive_replies.labels("used").inc()
            return preemptive
        self.discard()
        return None

    def discard(self) -> None:
        """The turn started at the pause is not wanted: its requests are aborted."""
        preemptive, self.preemptive = self.preemptive, None
        if preemptive is not None:
            self.session.call.metrics.preemptive_replies.labels("discarded").inc()
            with log_context(turn_id=preemptive.turn.turn_id):
                self.session.call.spawn(preemptive.discard())

    async def aclose(self) -> None:
        """The call ended: a turn started at a pause is aborted before the call's end."""
        preemptive, self.preemptive = self.preemptive, None
        if preemptive is not None:
            await preemptive.discard()
