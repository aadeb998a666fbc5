"""The phone's audio as a WebRTC track: 8 kHz frames from RTP, sent on the track's own clock.

RTP from a phone arrives with network jitter and on the phone's clock; aiortc's sender pulls
frames as fast as `recv()` returns them. So frames wait in a short bounded queue and `recv()`
hands one out every 20 ms on an absolute clock (start + n x 20 ms), silence when none is
waiting. When the phone's clock runs faster than ours the oldest frames are dropped, so the
delay never grows past the queue. The frames stay 8 kHz: aiortc's G.711 encoder takes them as
they are (no resampling on the way to the server).
"""

from __future__ import annotations

import asyncio
import fractions
from collections import deque

import av
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

RATE = 8_000  # G.711's sample rate
FRAME_MS = 20
FRAME_SAMPLES = RATE * FRAME_MS // 1000
FRAME_BYTES = FRAME_SAMPLES * 2  # s16
QUEUED_FRAMES = 10  # 200 ms: more than this waiting and the oldest go
_SILENCE = bytes(FRAME_BYTES)
_TIME_BASE = fractions.Fraction(1, RATE)


class PhoneAudioTrack(MediaStreamTrack):
    """Plays the phone's PCM (s16 mono, 8 kHz) in 20 ms frames on a real-time clock."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._frames: deque[bytes] = deque(maxlen=QUEUED_FRAMES)
        self._pending = bytearray()  # a partial frame (phones may pack 10 or 30 ms)
        self._sent = 0
        self._start: float | None = None
        self.dropped_frames = 0  # frames that waited too long and were dropped

    def push(self, pcm: bytes) -> None:
        """Queue PCM received from the phone (any length; cut into 20 ms frames)."""
        self._pending += pcm
        while len(self._pending) >= FRAME_BYTES:
            if len(self._frames) == self._frames.maxlen:
                self.dropped_frames += 1
            self._frames.append(bytes(self._pending[:FRAME_BYTES]))
            del self._pending[:FRAME_BYTES]

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        due = self._start + self._sent * FRAME_MS / 1000
        await asyncio.sleep(max(0.0, due - loop.time()))
        pcm = self._frames.popleft() if self._frames else _SILENCE
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(pcm)
        frame.sample_rate = RATE
        frame.pts = self._sent * FRAME_SAMPLES
        frame.time_base = _TIME_BASE
        self._sent += 1
        return frame
