"""Semantic end of turn (`turn_detection.type = "semantic_vad"`): at each pause of the caller's,
the profile's own Thinker judges whether the words so far end the turn.

The VAD marks a pause after PAUSE_MS of silence; the turn a preemptive reply starts there
(agent/realtime/preemptive.py) asks the Thinker, once it has heard the words, for the
probability of its end-of-turn token after them (pipeline/families/end_of_turn.py). At or above
the eagerness's threshold the turn ends at once, long before the end-of-turn silence, and the
reply already under way is the one the caller hears; below it the turn waits, up to the
eagerness's silence, for the caller to go on. A family that cannot score (no transcript) leaves
the silence alone to end turns.

The thresholds and silences are those `omnivox bench turn-ends` chose on the spoken corpus
(docs/realtime.md, "Semantic end of turn").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from media.vad import VadConfig

Eagerness = Literal["low", "medium", "high", "auto"]
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
