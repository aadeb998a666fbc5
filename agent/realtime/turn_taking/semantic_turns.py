"""Semantic end of turn (`turn_detection.type = "semantic_vad"`): at each pause of the caller's,
the profile's own Thinker judges whether the words so far end the turn.

The VAD marks a pause after PAUSE_MS of silence; the turn a preemptive reply starts there
(preemptive.py) asks the Thinker, once it has heard the words, for the
probability of its end-of-turn token after them (pipeline/families/kit/end_of_turn.py). At or above
the eagerness's threshold the turn ends at once, long before the end-of-turn silence, and the
reply already under way is the one the caller hears; below it the turn waits, up to the
eagerness's silence, for the caller to go on. A family that cannot score (no transcript) leaves
the silence alone to end turns.

The thresholds and silences are those `omnivox bench turn-ends` chose on the spoken corpus
(docs/realtime.md, "Semantic end of turn").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from agent.ops.metrics import Metrics
from media.vad import VadConfig
from pipeline.turns.events import Transcript

log = logging.getLogger(__name__)
PAUSE_MS = 200  # silence after which the words so far are judged


@dataclass(frozen=True)
class TurnEnding:
    """How eagerly turns end: the end-of-turn probability that ends one at a pause, and the
    silence that ends one whatever the words."""

    threshold: float
    silence_ms: int


EAGERNESS: dict[str, TurnEnding] = {
    "low": TurnEnding(threshold=0.5, silence_ms=2000),
    "medium": TurnEnding(threshold=0.25, silence_ms=1200),
    "high": TurnEnding(threshold=0.1, silence_ms=800),
}


def turn_ending(eagerness: str) -> TurnEnding:
    """`eagerness`'s settings ("auto" is OpenAI's default, "medium")."""
    return EAGERNESS["medium" if eagerness == "auto" else eagerness]


def semantic_vad(current: VadConfig, eagerness: str) -> VadConfig:
    """`current` with the pause that is judged and the silence that ends a turn regardless."""
    return dataclasses.replace(current, pause_ms=PAUSE_MS,
                               silence_ms=turn_ending(eagerness).silence_ms)


def server_vad(current: VadConfig, configured: VadConfig) -> VadConfig:
    """Back to server_vad from semantic_vad: the pause and the silence the server is configured
    with (`configured`, its settings' vad), not the eagerness's, and no pause is judged."""
    return dataclasses.replace(current, pause_ms=configured.pause_ms,
                               silence_ms=configured.silence_ms)


def ends_turn(eagerness: str, end_of_turn: float | None) -> bool:
    """Whether words the Thinker scored `end_of_turn` end the turn at this pause."""
    return end_of_turn is not None and end_of_turn >= turn_ending(eagerness).threshold


class SemanticTurns:
    """semantic_vad's judge of one call: told the caller's words heard at a pause, it ends the
    turn there when the Thinker scored them a whole turn (the reply under way is then the one
    heard), else leaves the end to the eagerness's silence. Under server_vad it does nothing."""

    def __init__(self, eagerness: Callable[[], str | None], end_utterance: Callable[[], bool],
                 metrics: Metrics, call_id: str) -> None:
        self._eagerness = eagerness  # the session's, as it stands (None: server_vad)
        self._end_utterance = end_utterance  # closes the utterance at its pause, if still in one
        self._metrics, self._call_id = metrics, call_id

    def judge(self, heard: Transcript) -> None:
        """End the turn at this pause if `heard`, as the Thinker scored it, is a whole turn."""
        eagerness = self._eagerness()
        if eagerness is None:
            return
        ended = ends_turn(eagerness, heard.end_of_turn) and self._end_utterance()
        self._metrics.semantic_turn_ends.labels("ended" if ended else "waited").inc()
        log.info("call %s: %r scored %s as a whole turn: %s", self._call_id, heard.text,
                 "unscored" if heard.end_of_turn is None else f"{heard.end_of_turn:.2f}",
                 "turn ended at the pause" if ended else "waiting")
