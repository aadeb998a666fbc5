"""How far a turn's rendered audio runs ahead of the caller, on a clock the test moves."""

from __future__ import annotations

import pytest

from pipeline.turns.audio_ahead import AudioAhead


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_audio_ahead_is_what_was_rendered_less_what_has_played() -> None:
    clock = Clock()
    ahead = AudioAhead(2.0, clock=clock)
    ahead.cut(0)
    assert ahead.ahead_s() is None and not ahead.running_low()  # nothing to hear yet
    clock.now += 0.5
    ahead.rendered(0, 1.2)  # first audio, half a second after its cut
    assert ahead.ahead_s() == pytest.approx(1.2)
    assert not ahead.running_low()  # 1.2 s ahead >= 2 x 0.5 s of voicing
    clock.now += 0.3
    assert ahead.ahead_s() == pytest.approx(0.9)
    assert ahead.running_low()  # 0.9 s < 1.0 s: the next chunk must be cut now
    ahead.cut(1)
    clock.now += 0.6
    ahead.rendered(1, 2.0)  # the longest voicing delay (0.6 s) is the one that counts now
    assert ahead.ahead_s() == pytest.approx(2.3)
    clock.now += 1.0
    assert not ahead.running_low()  # 1.3 s ahead, not under 2 x 0.6 s... yet
    clock.now += 0.2
    assert ahead.ahead_s() == pytest.approx(1.1) and ahead.running_low()
    ahead.cut(2)
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
    ahead.cut(0)
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
    ahead.cut(0)
    clock.now += 1.0
    ahead.rendered(0, 0.1)
    clock.now += 5.0
    assert ahead.ahead_s() == pytest.approx(-4.9) and not ahead.running_low()
