"""RFC 4733 DTMF in media/dtmf.py, on packets built by hand from the RFC's layout (section
2.3: event, E|R|volume, 16-bit duration): one key press per event whatever the repeats, the
three final copies, late copies and reordering; the packets we send for a press."""

from __future__ import annotations

import struct

import pytest

from media.dtmf import (
    FINAL_COPIES,
    REMEMBERED_EVENTS,
    DtmfDecoder,
    digit_of,
    press_updates,
)

SSRC = 0x0E05384E


def payload(event: int, duration: int, end: bool = False, volume: int = 10) -> bytes:
    """One telephone-event payload: event code, E bit (0x80) with a 6-bit volume, duration."""
    return struct.pack("!BBH", event, (0x80 if end else 0) | volume, duration)


def press(event: int, updates: int = 5) -> list[bytes]:
    """A press as phones send it: updates every 160 samples (20 ms), the final one three times
    (the SIPp capture /usr/share/sip-tester/dtmf_2833_1.pcap has this shape)."""
    sent = [payload(event, 160 * n) for n in range(updates)]
    return sent + [payload(event, 160 * updates, end=True)] * 3


def decoded(decoder: DtmfDecoder, packets: list[tuple[int, int, bytes]]) -> list[str]:
    return [d for d in (decoder.push(*p) for p in packets) if d is not None]


@pytest.mark.parametrize(("event", "digit"), [
    (0, "0"), (1, "1"), (9, "9"), (10, "*"), (11, "#"), (12, "A"), (15, "D"),
])
def test_event_codes_are_the_keys_of_the_rfc(event: int, digit: str) -> None:
    assert digit_of(payload(event, 0)) == digit


def test_events_that_are_no_key_and_short_payloads() -> None:
    assert digit_of(payload(16, 0)) is None  # flash: an event, not a key
    with pytest.raises(ValueError, match="4 bytes"):
        digit_of(b"\x01\x0a")
    decoder = DtmfDecoder()
    assert decoder.push(SSRC, 1, b"\x01") is None and decoder.malformed == 1


def test_one_press_is_one_key_whatever_its_updates_and_final_copies() -> None:
    decoder = DtmfDecoder()
    packets = [(SSRC, 13280, p) for p in press(1)] + [(SSRC, 92640, p) for p in press(11)]
    assert decoded(decoder, packets) == ["1", "#"]


def test_the_same_key_twice_is_two_presses() -> None:
    decoder = DtmfDecoder()
    packets = [(SSRC, 1000, p) for p in press(5)] + [(SSRC, 3000, p) for p in press(5)]
    assert decoded(decoder, packets) == ["5", "5"]


def test_a_press_whose_first_packets_were_lost_still_counts_once() -> None:
    decoder = DtmfDecoder()
    finals = [(SSRC, 5000, payload(7, 800, end=True))] * 3
    assert decoded(decoder, finals) == ["7"]


def test_a_late_copy_of_an_earlier_press_is_not_a_new_one() -> None:
    decoder = DtmfDecoder()
    first, second = press(2), press(3)
    packets = [(SSRC, 100, p) for p in first[:-1]] + [(SSRC, 900, second[0])]
    packets += [(SSRC, 100, first[-1])] + [(SSRC, 900, p) for p in second[1:]]
    assert decoded(decoder, packets) == ["2", "3"]


def test_streams_are_told_apart_by_ssrc() -> None:
    decoder = DtmfDecoder()
    assert decoded(decoder, [(1, 500, payload(4, 0)), (2, 500, payload(4, 0))]) == ["4", "4"]


def test_memory_of_presses_is_bounded() -> None:
    decoder = DtmfDecoder()
    for n in range(REMEMBERED_EVENTS * 3):
        assert decoder.push(SSRC, n * 2000, payload(n % 10, 0)) == str(n % 10)
    assert len(decoder._seen) == REMEMBERED_EVENTS


def test_a_press_we_send_is_updates_then_three_finals_and_reads_back_as_one_key() -> None:
    updates = press_updates("#", 100, 8000)
    fields = [struct.unpack("!BBH", u.payload) for u in updates]
    assert [f[0] for f in fields] == [11] * len(updates)
    assert [f[2] for f in fields] == [160, 320, 480, 640, 800, 800, 800]
    assert [bool(f[1] & 0x80) for f in fields] == [False] * 4 + [True] * FINAL_COPIES
    assert [u.marker for u in updates] == [True] + [False] * (len(updates) - 1)
    decoder = DtmfDecoder()
    assert decoded(decoder, [(SSRC, 42, u.payload) for u in updates]) == ["#"]


def test_a_short_press_is_still_one_update_long_and_a_bad_key_is_refused() -> None:
    assert len(press_updates("1", 0, 8000)) == FINAL_COPIES
    with pytest.raises(ValueError, match="not a DTMF key"):
        press_updates("E", 100, 8000)
    with pytest.raises(ValueError, match="not a DTMF key"):
        press_updates("12", 100, 8000)
