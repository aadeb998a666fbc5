"""How many tokens a reply may take in a Thinker's context window.

A reply's max_tokens is a ceiling, not a demand: "inf" (4096) or a long limit on a model with a
short context must not fail the turn, so the budget is whatever the prompt leaves, up to it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)
# Fewer tokens than this left after the prompt: the history is too long to answer usefully.
MIN_REPLY_TOKENS = 16
# The history is trimmed in steps of the window divided by this (see fit_history).
TRIM_STEPS = 8
# How a history too long for the window is cut (OpenAI Realtime's session `truncation`): "auto",
# in steps; "disabled", never (the turn then fails); a float, the share of the room the history
# may fill that is kept (OpenAI's retention_ratio).
Truncation = str | float
AUTO, DISABLED = "auto", "disabled"


def reply_budget(prompt_tokens: int, max_tokens: int, max_model_len: int) -> int:
    """Tokens the reply may generate: max_tokens, cut to the room the prompt leaves.

    Raises ValueError when the prompt leaves less than MIN_REPLY_TOKENS (or max_tokens, if
    smaller) of the window."""
    room = max_model_len - prompt_tokens
    if room < min(max_tokens, MIN_REPLY_TOKENS):
        raise ValueError(f"prompt of {prompt_tokens} tokens leaves {max(room, 0)} of "
                         f"max_model_len {max_model_len} for the reply")
    return min(max_tokens, room)


def wanted_room(max_tokens: int, max_model_len: int) -> int:
    """Room a history-trimming prompt builder keeps free for the reply: the whole max_tokens
    when it fits in half the window, else half the window (older turns go before the reply
    is cut shorter than that)."""
    return min(max_tokens, max_model_len // 2)


def fit_history(messages: list[dict[str, str]], length: Callable[[list[dict[str, str]]], int],
                max_tokens: int, max_model_len: int, keep: int = 1,
                truncation: Truncation = AUTO) -> list[dict[str, str]]:
    """The messages to prompt with: after the system message, the oldest turns go while the
    prompt (`length` of the messages) leaves less than `wanted_room` for the reply; the newest
    `keep` turns always stay (0 when the caller's audio is the newest turn).

    AUTO: the turns go in steps of an eighth of the window (TRIM_STEPS): what is dropped is the
    excess rounded up to a whole step, so the next turns, each a little longer, drop the very
    same turns until the excess passes the next step. The prompt's start then stays
    token-identical from turn to turn and the engine's prefix cache keeps serving it; dropping
    just enough each turn would change it every turn and prefill the whole history again.
    A retention ratio instead drops turns until the history fills at most that share of the
    room it may fill (the window less the reply's room and the system message); DISABLED drops
    none (reply_budget then refuses the prompt)."""
    head = messages[:1] if messages and messages[0].get("role") == "system" else []
    turns = messages[len(head):]
    room = wanted_room(max_tokens, max_model_len)
    whole = length(head + turns)
    excess = whole + room - max_model_len
    if excess <= 0 or truncation == DISABLED:
        return head + turns
    if isinstance(truncation, float):
        system = length(head) if head else 0
        limit = system + int(truncation * (max_model_len - room - system))
    else:
        step = max(1, max_model_len // TRIM_STEPS)
        limit = whole - -(-excess // step) * step  # the excess rounded up to a whole step
    dropped = 0
    while len(turns) > keep and length(head + turns) > limit:
        turns = turns[1:]
        dropped += 1
    if dropped:
        logger.info("history too long for the context window: dropped its %d oldest turns",
                    dropped)
    return head + turns
