"""Answer quality (`omnivox bench answers`): the question set's structure, the keyword scorer, and
a slice of the set answered by the `local` profile's Thinker through the real server's chat
completions (greedy, as the profile decodes), with the accuracy floor the bench measured."""

from __future__ import annotations

import httpx
import pytest

from agent.bench.answer_score import Answered, by_category, holds, is_right
from agent.bench.answer_set import QUESTIONS, Question
from agent.config import DEFAULT_INSTRUCTIONS
from tests.served import Served

SLICE = QUESTIONS[::6]  # 9 questions, one in six: every kind of item, not the easy ones only
# `omnivox bench answers` (typed, the chosen examples, greedy): 6 of this slice right, every run.
SLICE_FLOOR = 6


def test_the_set_has_every_kind_of_item() -> None:
    categories = {q.category for q in QUESTIONS}
    assert len(QUESTIONS) >= 40
    assert {"capital", "arithmetic", "calendar", "colour", "animal", "greeting", "thanks",
            "yes/no", "follow-up"} <= categories
    assert all(q.any_of or q.all_of for q in QUESTIONS)
    follow_ups = [q for q in QUESTIONS if q.category == "follow-up"]
    assert len(follow_ups) >= 5
    assert all(len(q.before) % 2 == 0 and q.messages()[-1]["role"] == "assistant"
               for q in follow_ups)
    assert len({(q.before, q.question) for q in QUESTIONS}) == len(QUESTIONS)


def test_keywords_match_whole_words_case_and_punctuation_aside() -> None:
    assert holds("The capital is PARIS.", "paris")
    assert holds("You\u2019re welcome!", "you're welcome")
    assert not holds("Parisian food", "paris")
    assert not holds("Snowy blue", "no")
    assert holds("Have a nice day", "have a")


def test_an_answer_is_right_with_one_of_any_all_of_all_and_none_of_none() -> None:
    q = Question("t", "Is fire cold?", any_of=("no", "not"), all_of=("fire",), none_of=("yes",))
    assert is_right(q, "No, fire is hot.")
    assert is_right(q, "Fire is not cold.")
    assert not is_right(q, "No, it is hot.")  # all_of missing
    assert not is_right(q, "Yes, no, fire is cold.")  # none_of present
    assert not is_right(q, "Fire is hot.")  # none of any_of
    assert is_right(Question("t", "Say anything", all_of=("a",)), "a b")


def test_tallies_per_category_then_all() -> None:
    capital = Question("capital", "What is the capital of Spain?", any_of=("madrid",))
    colour = Question("colour", "What colour is snow?", any_of=("white",))
    answered = [Answered(capital, "", "Madrid.", 100.0), Answered(capital, "", "Rome.", 300.0),
                Answered(colour, "", "White.", 200.0)]
    tallies = {t.name: t for t in by_category(answered)}
    assert list(tallies) == ["capital", "colour", "all"]
    assert (tallies["capital"].right, tallies["capital"].count) == (1, 2)
    assert tallies["capital"].median_ms == 200.0
    assert tallies["all"].right == 2 and tallies["all"].accuracy == pytest.approx(2 / 3)


@pytest.mark.engines
async def test_the_local_thinker_answers_the_slice_above_its_floor(local_server: Served) -> None:
    answered = []
    async with httpx.AsyncClient(base_url=local_server.url, timeout=120) as http:
        for q in SLICE:
            messages = [{"role": "system", "content": DEFAULT_INSTRUCTIONS}, *q.messages(),
                        {"role": "user", "content": q.question}]
            reply = await http.post("/v1/chat/completions", json={
                "model": "local", "messages": messages, "max_tokens": 64, "temperature": 0})
            assert reply.status_code == 200, reply.text
            answer = reply.json()["choices"][0]["message"]["content"]
            answered.append(Answered(q, q.question, answer, 0.0))
    for a in answered:
        print(f"\n[answers] {'right' if a.right else 'WRONG'} {a.question.question!r}: "
              f"{a.answer!r}")
    assert sum(a.right for a in answered) >= SLICE_FLOOR
