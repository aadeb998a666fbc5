"""What a stage keeps for each turn between the turn's jobs (the omni families' Talkers and
VoiceBoxes): the turn a job belongs to, and the turns' states, the newest last.

A turn's jobs come one after another, with request ids `call/turn/<stage>/<part>` as the
cascade forms them: the turn is the id without its last part. A turn cancelled between its
jobs sends no request to abort, so its state would stay: the oldest turns beyond a limit are
dropped.
"""

from __future__ import annotations

from typing import TypeVar

State = TypeVar("State")


def turn_of(request_id: str) -> str:
    """The turn a request belongs to: its id without the last `/` part."""
    return request_id.rpartition("/")[0]


def keep_newest(states: dict[str, State], turn: str, state: State, limit: int) -> None:
    """Keep `state` as the newest turn's, dropping the oldest turns beyond `limit`."""
    states.pop(turn, None)
    states[turn] = state
    while len(states) > limit:
        states.pop(next(iter(states)))
