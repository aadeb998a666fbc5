"""What part of a reply the caller heard, from the audio played and each chunk's text span."""

from __future__ import annotations

from agent.realtime.history import Conversation, SpokenText

REPLY = "Hello there, how are you today? I am fine."


def spoken() -> SpokenText:
    s = SpokenText()
    s.add_chunk(1000, 0, 12)  # "Hello there,"
    s.add_chunk(800, 12, 31)  # " how are you today?" in two audio chunks
    s.add_chunk(1200, 12, 31)
    s.add_chunk(1000, 31, len(REPLY))
    return s


def test_heard_follows_played_audio_in_whole_words() -> None:
    s = spoken()
    assert s.total_ms == 4000
    assert s.heard(REPLY, 0) == ""
    assert s.heard(REPLY, 500) == "Hello"
    assert s.heard(REPLY, 1000) == "Hello there,"
    # One span voiced by two chunks counts as one: half of its 2 s is half of its text.
    assert s.heard(REPLY, 2000) == "Hello there, how are"
    assert s.heard(REPLY, 3000) == "Hello there, how are you today?"
    assert s.heard(REPLY, 3500) == "Hello there, how are you today? I"
    assert s.heard(REPLY, 9999) == REPLY


def test_conversation_is_bounded_and_keeps_instructions_apart() -> None:
    c = Conversation("Be brief.", max_items=3)
    for i in range(5):
        c.add(f"item{i}", "user" if i % 2 == 0 else "assistant", f"text {i}")
    c.add("empty", "assistant", "")
    assert [i.item_id for i in c.items] == ["item3", "item4", "empty"]
    assert c.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": "text 3"},
        {"role": "user", "content": "text 4"},
    ]
    assert c.get("item4").text == "text 4" and c.get("item0") is None


def test_a_full_conversation_drops_its_oldest_in_steps() -> None:
    """Past max_items a quarter goes at once: the history's start (the Thinker's cached
    prompt prefix) stays the same for the next few messages."""
    c = Conversation("", max_items=8)
    firsts = []
    for i in range(20):
        c.add(f"item{i}", "user", f"text {i}")
        assert len(c.items) <= 8 and c.items[-1].item_id == f"item{i}"
        firsts.append(c.items[0].item_id)
    assert firsts[8:] == ["item2"] * 2 + ["item4"] * 2 + ["item6"] * 2 + ["item8"] * 2 + [
        "item10"] * 2 + ["item12"] * 2
