"""RFC 4733 DTMF (`telephone-event` over RTP): the key presses in the packets a caller sends, and
the packets of a key press we send.

A sender repeats each event in updates every 20 ms (same RTP timestamp, growing duration) and
sends its final packet, with the E bit, three times; one key press is one (SSRC, timestamp).
aiortp (the SIP bridge's RTP stack) reads and writes the 4-byte payload; the rest is here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiortc.rtp import RtpPacket
from aiortp.dtmf import DTMF_EVENTS, EVENT_TO_DIGIT, DtmfEvent

log = logging.getLogger(__name__)

TELEPHONE_EVENT = "telephone-event"  # the codec's name in SDP
UPDATE_MS = 20  # a sender's interval between updates (and between its final retransmissions)
FINAL_COPIES = 3  # RFC 4733 2.5.1.4: the final packet of an event is sent three times
REMEMBERED_EVENTS = 64  # (SSRC, timestamp) pairs kept to know a late retransmission
MAX_PRESS_MS = 1_000  # a longer press is sent as this long: still one press, no longer a wait
VOLUME = 10  # -10 dBm0, what phones commonly send


def digit_of(payload: bytes) -> str | None:
    """The key (0-9 * # A-D) of one telephone-event payload; None for other events (flash,
    tones). ValueError for a payload shorter than RFC 4733's 4 bytes."""
    return EVENT_TO_DIGIT.get(DtmfEvent.parse(payload).event)


class DtmfDecoder:
    """Turns a caller's telephone-event packets into key presses, one per press.

    A press is reported at its first packet seen (its updates and final copies are not), so a
    press whose final packets are lost is reported all the same. RFC 4733 limits an event's
    duration to 16 bits of timestamp: a key held past that (8 s at 8 kHz) starts a new event
    and reads as a second press.
    """

    def __init__(self) -> None:
        self._seen: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.malformed = 0  # packets too short to hold an event, dropped

    def push(self, ssrc: int, timestamp: int, payload: bytes) -> str | None:
        """The key pressed, when this packet starts a press; None otherwise."""
        try:
            digit = digit_of(payload)
        except ValueError:
            self.malformed += 1
            return None
        key = (ssrc, timestamp)
        if digit is None or key in self._seen:
            return None
        self._seen[key] = None
        while len(self._seen) > REMEMBERED_EVENTS:
            self._seen.popitem(last=False)
        return digit


@dataclass(frozen=True)
class EventUpdate:
    """One packet of a press: its payload, and whether it is the press's first (RTP marker)."""

    payload: bytes
    marker: bool


def press_updates(digit: str, duration_ms: int, clock_rate: int) -> list[EventUpdate]:
    """The packets of one press of `digit` lasting `duration_ms`, in order: an update every
    20 ms, then the final packet three times. ValueError for a key that is not 0-9 * # A-D."""
    event = DTMF_EVENTS.get(digit.upper()) if len(digit) == 1 else None
    if event is None:
        raise ValueError(f"not a DTMF key: {digit!r} (want one of 0-9 * # A-D)")
    step = clock_rate * UPDATE_MS // 1000
    total = max(step, min(duration_ms, MAX_PRESS_MS) * clock_rate // 1000)
    updates = [DtmfEvent(event, False, VOLUME, d).serialize() for d in range(step, total, step)]
    final = DtmfEvent(event, True, VOLUME, total).serialize()
    payloads = [*updates, *[final] * FINAL_COPIES]
    return [EventUpdate(p, marker=i == 0) for i, p in enumerate(payloads)]


SendRtp = Callable[[RtpPacket], Awaitable[None]]


class DtmfSender:
    """Sends key presses as RFC 4733 packets, one press at a time, an update every 20 ms.

    The events go in an RTP stream of their own (their own SSRC, sequence numbers and
    timestamps): the audio's sender numbers its packets where nothing else can follow, and
    SRTP would refuse a second run of sequence numbers under the audio's SSRC. At most
    `max_queued` presses wait; more are dropped (and counted)."""

    def __init__(self, send: SendRtp, payload_type: int, clock_rate: int,
                 max_queued: int = 16) -> None:
        self._send = send
        self.payload_type = payload_type
        self.clock_rate = clock_rate
        self._queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue(max_queued)
        self._ssrc = secrets.randbits(32)
        self._sequence = secrets.randbits(16)
        self._origin = secrets.randbits(32)
        self._task: asyncio.Task[None] | None = None
        self.sent = 0  # presses sent
        self.dropped = 0  # presses dropped: the queue was full

    def press(self, digit: str, duration_ms: int) -> None:
        """Queue one press of `digit` (ValueError for a key that is not 0-9 * # A-D)."""
        press_updates(digit, duration_ms, self.clock_rate)  # refuse a bad key here, not later
        try:
            self._queue.put_nowait((digit, duration_ms))
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("DTMF %r dropped: %d presses already waiting", digit, self._queue.qsize())
            return
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def drained(self) -> None:
        """Wait until every queued press has been sent."""
        await self._queue.join()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            digit, duration_ms = await self._queue.get()
            try:
                elapsed = int((loop.time() - start) * self.clock_rate)
                await self._send_press(digit, duration_ms, (self._origin + elapsed) & 0xFFFFFFFF)
            except ConnectionError as exc:  # the peer connection is going: nothing to send on
                log.info("DTMF %r not sent: %s", digit, exc)
            finally:
                self._queue.task_done()

    async def _send_press(self, digit: str, duration_ms: int, timestamp: int) -> None:
        for i, update in enumerate(press_updates(digit, duration_ms, self.clock_rate)):
            if i:
                await asyncio.sleep(UPDATE_MS / 1000)
            packet = RtpPacket(payload_type=self.payload_type, marker=int(update.marker),
                               sequence_number=self._sequence, timestamp=timestamp,
                               ssrc=self._ssrc, payload=update.payload)
            self._sequence = (self._sequence + 1) & 0xFFFF
            await self._send(packet)
        self.sent += 1
