"""The server VAD's end of turn: an utterance the VAD closed after its end-of-turn silence is the
caller's turn, committed and, when the session creates responses, answered by a reply of its
own; speech that ends while a reply is still heard is not a turn (too short to barge in, or
barge-in off), so that noise over the agent never starts a second reply."""

from __future__ import annotations

import logging
from typing import Protocol

from agent.config import ConversationSettings
from agent.realtime.reply import Reply
from media.vad import SpeechStopped

log = logging.getLogger(__name__)


class Floor(Protocol):
    """What the end of a turn needs of the conversation: its settings, the reply the caller
    hears, and how many committed utterances still wait for a reply."""

    @property
    def settings(self) -> ConversationSettings: ...

    @property
    def unanswered(self) -> int: ...

    def audible_reply(self) -> Reply | None: ...


def creates_responses(settings: ConversationSettings) -> bool:
    """Whether the session answers a committed turn itself: the server VAD takes the caller's
    turns and `create_response` is on (else the client asks, with response.create)."""
    return settings.create_response and settings.server_vad


class ServerVadTurns:
    """The session's rule for the utterances its VAD ends."""

    def __init__(self, floor: Floor, call_id: str) -> None:
        self._floor, self._call_id = floor, call_id

    def is_turn(self, event: SpeechStopped) -> bool:
        """Whether the utterance the VAD just closed is a turn of the caller's: not while a
        reply is audible, where it is logged and dropped."""
        if self._floor.audible_reply() is None:
            return True
        log.info("call %s: %d ms of caller audio during a reply ignored", self._call_id,
                 event.audio_end_ms - event.audio_start_ms)
        return False

    def answers(self) -> bool:
        """Whether the caller's utterance under way gets a reply of its own when the VAD ends
        it: no reply is audible, none waits for an answer, the session creates responses."""
        floor = self._floor
        return (floor.audible_reply() is None and not floor.unanswered
                and creates_responses(floor.settings))
