"""How far a turn's rendered audio runs ahead of the caller, on a clock the test moves."""

from __future__ import annotations

import pytest

from pipeline.audio_ahead import AudioAhead


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_audio_ahead_is_what_was_rendered_less_what_has_played() -> None:
    clock = Clock()
    ahead = AudioAhead(2.0, clock=clock)
    ahead.cut(0, 16)
    assert ahead.ahead_s() is None and not ahead.running_low()  # nothing to hear yet
    clock.now += 0.5
    ahead.rendered(0, 1.2)  # first audio, half a second after its cut
    assert ahead.ahead_s() == pytest.approx(1.2)
    assert not ahead.running_low()  # 1.2 s ahead >= 2 x 0.5 s of voicing
    clock.now += 0.3
    assert ahead.ahead_s() == pytest.approx(0.9)
    assert ahead.running_low()  # 0.9 s < 1.0 s: the next chunk must be cut now
    ahead.cut(1, 32)
    clock.now += 0.6
    ahead.rendered(1, 2.0)  # the longest voicing delay (0.6 s) is the one that counts now
    assert ahead.ahead_s() == pytest.approx(2.3)
    clock.now += 1.0
    assert not ahead.running_low()  # 1.3 s ahead, not under 2 x 0.6 s... yet
    clock.now += 0.2
    assert ahead.ahead_s() == pytest.approx(1.1) and ahead.running_low()
    ahead.cut(2, 48)
    clock.now += 0.1
    ahead.rendered(2, 0.5)  # a quicker chunk (0.1 s) does not shorten the estimate
    assert ahead.ahead_s() == pytest.approx(1.5) and not ahead.running_low()
    clock.now += 0.4
    assert ahead.running_low()  # 1.1 s ahead < 2 x 0.6 s (not 2 x 0.1 s)
    clock.now += 2.1
    assert ahead.ahead_s() == pytest.approx(-1.0)  # the caller has run dry


def test_later_groups_of_a_chunk_add_audio_but_not_a_voicing_delay() -> None:
    clock = Clock()
    ahead = AudioAhead(2.0, clock=clock)
    ahead.cut(0, 16)
    clock.now += 0.2
    ahead.rendered(0, 1.0)
    assert ahead.lowest_ahead_s is None  # nothing had played yet
    clock.now += 0.7
    ahead.rendered(0, 1.0)  # the chunk's second group: its delay is not a new measure
    assert ahead.ahead_s() == pytest.approx(1.3)
    assert not ahead.running_low()  # 1.3 >= 2 x 0.2
    # The lowest audio ahead just before new audio is kept for the turn's record.
    clock.now += 1.0
    ahead.rendered(0, 1.0)
    assert ahead.lowest_ahead_s == pytest.approx(0.3)
    clock.now += 1.6
    ahead.rendered(0, 1.0)
    assert ahead.lowest_ahead_s == pytest.approx(-0.3)  # it ran dry for 0.3 s


def test_without_a_factor_it_never_hurries() -> None:
    clock = Clock()
    ahead = AudioAhead(None, clock=clock)
    ahead.cut(0, 16)
    clock.now += 1.0
    ahead.rendered(0, 0.1)
    clock.now += 5.0
    assert ahead.ahead_s() == pytest.approx(-4.9) and not ahead.running_low()


def thinker_wrote(ahead: AudioAhead, clock: Clock, chars_per_s: float, seconds: float) -> None:
    """The Thinker writes at `chars_per_s` for `seconds`, a character at a time."""
    for _ in range(round(chars_per_s * seconds)):
        clock.now += 1 / chars_per_s
        ahead.wrote(1)


def test_a_fast_thinker_does_not_hold_the_first_audio() -> None:
    clock = Clock()
    ahead = AudioAhead(2.0, 16, max_hold_s=1.0, clock=clock)
    ahead.wrote(4)
    thinker_wrote(ahead, clock, 40.0, 0.4)  # 16 more characters: 20 in all
    ahead.cut(0, 20)
    thinker_wrote(ahead, clock, 40.0, 0.2)  # 8 of the next chunk's written while it voices
    assert ahead.rendered(0, 1.2) == 0.0  # 8 more: 0.2 s, + 2 x 0.2 s voicing < 1.2 s
    assert ahead.ahead_s() == pytest.approx(1.2)


def test_a_slow_thinker_holds_the_first_audio_for_what_it_would_miss() -> None:
    clock = Clock()
    ahead = AudioAhead(2.0, 16, max_hold_s=1.0, clock=clock)
    ahead.wrote(4)
    thinker_wrote(ahead, clock, 10.0, 1.6)  # 16 more at 10 chars/s
    ahead.cut(0, 20)
    thinker_wrote(ahead, clock, 10.0, 0.4)  # 4 of the next chunk's 16 written
    hold = ahead.rendered(0, 1.0)
    # 12 missing characters at 10/s (1.2 s), then 2 x 0.4 s of voicing: 2.0 s, vs 1.0 s heard
    assert hold == pytest.approx(1.0)
    assert ahead.ahead_s() == pytest.approx(2.0)  # it starts playing only after the hold
    clock.now += 1.5
    assert ahead.ahead_s() == pytest.approx(0.5)


def test_the_hold_is_bounded_and_off_when_the_reply_is_written_or_there_is_no_factor() -> None:
    def held(factor: float | None, max_hold_s: float, finished: bool) -> float:
        clock = Clock()
        ahead = AudioAhead(factor, 16, max_hold_s, clock=clock)
        ahead.wrote(4)
        thinker_wrote(ahead, clock, 5.0, 3.2)
        ahead.cut(0, 20)
        clock.now += 0.5
        if finished:
            ahead.finished_writing()
        return ahead.rendered(0, 0.5)

    # 16 characters in 3.7 s so far: the next 16 in 3.7 s, then 2 x 0.5 s, vs 0.5 s heard
    assert held(2.0, 10.0, finished=False) == pytest.approx(3.7 + 1.0 - 0.5)
    assert held(2.0, 0.3, finished=False) == pytest.approx(0.3)
    assert held(2.0, 10.0, finished=True) == 0.0  # no chunk waits for the Thinker's words
    assert held(None, 10.0, finished=False) == 0.0

