"""The inbound jitter buffer (`inbound_jitter_packets`) puts reordered caller packets back in
order: real RTP from a real aiortc caller whose packets leave in swapped pairs (each second
packet overtakes the first, as on a path with reordering), decoded by the server in the order
they were sent, none lost; a packet later than the buffer holds (16) is dropped.

Each 20 ms frame the caller sends is a tone whose pitch says its place in the stream (32
pitches in turn), so the server's decoded frames, as its VAD gets them, show their order. G.711
(PCMU) keeps a frame's pitch exact and a packet per frame.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest

from agent.config import Settings
from media.peer import JITTER_CAPACITY
from tests.media_servers import call_of, tone_server
from tests.product_calls import wait_until
from tests.rtc_client import ArrayAudioTrack, RtcCaller

RATE = 48_000
FRAME = RATE // 50  # 20 ms
PITCHES = [200.0 + 100.0 * i for i in range(32)]  # 200-3300 Hz, inside G.711's band
FRAMES = 150  # 3 s
SWAP_FROM = 10  # packets sent in order first


def marked_frames() -> np.ndarray:
    """FRAMES frames of 20 ms, frame k a tone at PITCHES[k % 32]."""
    t = np.arange(FRAME) / RATE
    frames = [np.sin(2 * np.pi * PITCHES[k % len(PITCHES)] * t) for k in range(FRAMES)]
    return (np.concatenate(frames) * 0.4 * 32767).astype(np.int16)


def pitch_index(frame: np.ndarray, rate: int) -> int | None:
    """Which of PITCHES `frame` (int16) carries, or None for a quiet one (or one that holds
    only a resampler's tail of the tone)."""
    samples = frame.astype(np.float64)
    if np.sqrt(np.mean(samples ** 2)) < 4000:  # the tone's RMS is about 9300
        return None
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    peak_hz = np.argmax(spectrum) * rate / len(samples)
    return int(np.argmin([abs(peak_hz - p) for p in PITCHES]))


Send = Callable[[bytes], Awaitable[None]]


def reorder(send: Send, late_by: int | None = None) -> tuple[Send, list[int]]:
    """A DTLS transport's `_send_rtp` that reorders RTP packets (never RTCP) after the first
    SWAP_FROM: in swapped pairs (0..9, 11, 10, 13, 12, ...), or, with `late_by`, packet
    SWAP_FROM alone sent after `late_by` later ones. Also returns the list of packets (their
    place in the stream) sent out of order."""
    held: list[tuple[int, bytes]] = []
    moved: list[int] = []
    count = 0

    async def reordering(data: bytes) -> None:
        nonlocal count
        if 192 <= data[1] <= 223:  # RTCP
            await send(data)
            return
        n, count = count, count + 1
        if n < SWAP_FROM or (late_by is not None and n > SWAP_FROM + late_by):
            await send(data)
        elif late_by is not None:
            if n == SWAP_FROM:
                held.append((n, data))
                return
            await send(data)
            if n == SWAP_FROM + late_by:
                moved.append(held[0][0])
                await send(held.pop()[1])
        elif not held:
            held.append((n, data))
        else:
            await send(data)
            moved.append(held[0][0])
            await send(held.pop()[1])

    return reordering, moved


async def decode_reordered(tmp_path: Path, held: int, late_by: int | None
                           ) -> tuple[list[int], list[int]]:
    """The pitch indexes of the frames the server decoded (in its VAD's order) from a caller
    whose packets are reordered, and the packets that were sent out of order."""
    async with tone_server(Settings(data_dir=tmp_path, inbound_jitter_packets=held)) as served:
        caller = RtcCaller(served.url, ArrayAudioTrack(marked_frames()), codecs=("PCMU",))
        try:
            await caller.connect()
            transport = caller.pc.getTransceivers()[0].sender.transport
            transport._send_rtp, moved = reorder(transport._send_rtp, late_by)  # DTLS not up yet
            call = call_of(served, caller)
            decoded: list[int | None] = []
            push = call.vad.push

            def spy(frame: np.ndarray) -> list:
                decoded.append(pitch_index(frame, 16_000))
                return push(frame)

            call.vad.push = spy  # the call hands each decoded 16 kHz frame to its VAD
            await wait_until(lambda: caller.audio.position_ms >= FRAMES * 20 + 400, 30,
                             "the caller to send every frame")
            await asyncio.sleep(0.5)
        finally:
            await caller.close()
    return [i for i in decoded if i is not None], moved


def steps(marked: list[int]) -> list[int]:
    return [(b - a) % len(PITCHES) for a, b in itertools.pairwise(marked)]


@pytest.mark.parametrize("held", [1, 4])
async def test_packets_reordered_within_the_held_window_are_decoded_in_order(
    tmp_path: Path, held: int
) -> None:
    marked, moved = await decode_reordered(tmp_path, held, None)
    assert len(moved) >= 60, moved  # the caller really sent its packets in swapped pairs
    # Every frame sent, decoded in the order it was sent (a frame or two may be cut off at the
    # ends by the resampler and the last packets still held): each the next pitch in turn.
    assert FRAMES - held - 2 <= len(marked) <= FRAMES, (len(marked), marked)
    assert steps(marked) == [1] * (len(marked) - 1), marked


@pytest.mark.parametrize("held, late_by", [(1, 6), (4, JITTER_CAPACITY + 4)])
async def test_a_late_packet_is_put_in_place_within_the_buffer_and_dropped_beyond(
    tmp_path: Path, held: int, late_by: int
) -> None:
    """One packet overtaken by `late_by` later ones. However few packets are held, it is decoded
    in its place while it is less than the buffer's 16 packets late (the ones after it wait for
    it); later than that it is dropped (with a few of those held around it): the frames decoded
    stay in order, with one gap."""
    marked, moved = await decode_reordered(tmp_path, held, late_by)
    assert moved == [SWAP_FROM]
    assert FRAMES - held - 3 <= len(marked) <= FRAMES, (len(marked), marked)
    gaps = [(i, step) for i, step in enumerate(steps(marked)) if step != 1]
    if late_by < JITTER_CAPACITY:
        assert gaps == [], marked
    else:  # the late one is lost (and a few held around it): one gap, the rest in order
        assert len(gaps) == 1 and 2 <= gaps[0][1] <= JITTER_CAPACITY, (gaps, marked)
