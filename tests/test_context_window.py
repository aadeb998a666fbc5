"""A reply's max_tokens is a ceiling the Thinker's context window may lower, never a reason to
fail a turn that still has room to answer."""

from __future__ import annotations

import itertools

import pytest

from pipeline.families.kit.context_window import (
    DISABLED,
    MIN_REPLY_TOKENS,
    fit_history,
    reply_budget,
    wanted_room,
)


@pytest.mark.parametrize(("prompt", "max_tokens", "budget"), [
    (100, 96, 96),        # fits: the whole limit
    (100, 4096, 924),     # "inf": what the window leaves
    (1000, 4096, 24),     # a long history: a short answer, still an answer
    (1020, 3, 3),         # a tiny limit that fits exactly
])
def test_the_budget_is_the_limit_cut_to_the_room_left(prompt: int, max_tokens: int,
                                                      budget: int) -> None:
    assert reply_budget(prompt, max_tokens, 1024) == budget


@pytest.mark.parametrize("prompt", [1024 - MIN_REPLY_TOKENS + 1, 1024, 2000])
def test_a_prompt_that_fills_the_window_is_refused(prompt: int) -> None:
    with pytest.raises(ValueError, match="max_model_len 1024"):
        reply_budget(prompt, 4096, 1024)


def test_history_trimming_keeps_room_for_the_reply() -> None:
    assert wanted_room(96, 2048) == 96
    assert wanted_room(4096, 2048) == 1024


def test_the_oldest_turns_go_until_the_reply_has_room() -> None:
    system = {"role": "system", "content": "s"}
    turns = [{"role": "user", "content": str(i)} for i in range(5)]
    length = 300  # tokens per message, say

    def measure(messages: list[dict[str, str]]) -> int:
        return length * len(messages)

    # 1024-token window, 96-token reply: three messages (900) fit, with room for the reply.
    assert fit_history([system, *turns], measure, 96, 1024) == [system, *turns[-2:]]
    assert fit_history([system, *turns[-1:]], measure, 4096, 1024) == [system, turns[-1]]
    assert fit_history([system, *turns], measure, 96, 1024, keep=0) == [system, *turns[-2:]]
    assert fit_history([system, *turns], lambda m: 1, 96, 1024) == [system, *turns]


def test_the_trimmed_history_keeps_its_start_while_it_grows() -> None:
    """Once the history is trimmed, the next turns (each a little longer) drop the very same
    oldest turns until the excess passes a whole step: the prompt's start stays the same for
    the prefix cache, and every prompt still leaves the reply its room."""
    system = {"role": "system", "content": "s"}

    def measure(messages: list[dict[str, str]]) -> int:
        return 10 + 30 * (len(messages) - 1)  # a 10-token system prompt, 30 tokens a turn

    firsts = []
    for n in range(40, 100):  # over the window from 51 turns on
        turns = [{"role": "user", "content": str(i)} for i in range(n)]
        kept = fit_history([system, *turns], measure, 512, 2048)
        assert measure(kept) + wanted_room(512, 2048) <= 2048
        firsts.append(kept[1]["content"])
    # 30 tokens a turn, trimmed in steps of 256 tokens: over the 49 turns past the window the
    # start moves once in 8-9 turns, where trimming just enough would move it every turn.
    moves = sum(a != b for a, b in itertools.pairwise(firsts))
    assert firsts[0] == "0" and 4 <= moves <= 7, firsts


def test_a_retention_ratio_keeps_that_share_of_the_room_and_disabled_keeps_all() -> None:
    system = {"role": "system", "content": "s"}

    def measure(messages: list[dict[str, str]]) -> int:
        return 10 + 30 * (len(messages) - 1)  # a 10-token system prompt, 30 tokens a turn

    turns = [{"role": "user", "content": str(i)} for i in range(80)]  # 2,410 > 2,048
    room = wanted_room(512, 2048)
    for share in (0.25, 0.5, 0.8):
        kept = fit_history([system, *turns], measure, 512, 2048, truncation=share)
        allowed = 10 + share * (2048 - room - 10)
        assert allowed - 30 < measure(kept) <= allowed, (share, measure(kept))  # just under
        assert kept[-1] == turns[-1] and kept[0] == system  # the newest stay, the system too
    auto = fit_history([system, *turns], measure, 512, 2048)
    assert measure(auto) > measure(fit_history([system, *turns], measure, 512, 2048,
                                                truncation=0.8))
    assert fit_history([system, *turns], measure, 512, 2048, truncation=DISABLED) == [
        system, *turns]  # nothing dropped: the reply's budget then refuses the prompt
    with pytest.raises(ValueError, match="leaves"):
        reply_budget(measure([system, *turns]), 512, 2048)
