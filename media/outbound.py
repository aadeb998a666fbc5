"""The agent's outgoing audio track: a bounded queue of 48 kHz PCM played out in paced 20 ms frames.

aiortc's sender pulls frames as fast as `recv()` returns them, so the track paces itself on an
absolute clock (frame n leaves at start + n * 20 ms of loop time) and sends silence whenever
nothing is queued. Writers get back-pressure from a queue bounded in milliseconds; a flush
(barge-in) drops everything at once, and the frame after it fades out the audio that would
have come next over FADE_MS: a step to silence rings on through Opus (a 100 Hz tone at -6 dBFS
stays above -50 dBFS 87 ms after the cut at the caller's decoder), the fade is heard for 7 ms and
only its frame's coding noise, about -45 dBFS, to the end of that frame
(tests/test_outbound.py).
"""

from __future__ import annotations

import asyncio
import fractions
import logging
from collections import deque
from collections.abc import Callable

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from media.audio_format import FRAME_MS
from media.pacing import pacing_lateness

logger = logging.getLogger(__name__)

SAMPLE_RATE = 48_000  # Opus's rate; G.711 calls are resampled to 8 kHz by aiortc's encoder
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000
TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
_FRAME_S = FRAME_MS / 1000

# A sender this many frames behind its clock (stalled event loop) is re-anchored to now
# instead of being handed the backlog as a burst.
MAX_LAG_FRAMES = 5
# Source audio is resampled and queued in slices of this length, so one write never holds
# the event loop for long and back-pressure applies inside a long write.
WRITE_SLICE_MS = 100
# A flush's fade-out (raised cosine): long enough to leave no step for Opus to ring on, short
# enough to be over well inside the frame after the cut.
FADE_MS = 5
_FADE = np.cos(np.linspace(0.0, np.pi / 2, SAMPLE_RATE * FADE_MS // 1000, endpoint=False)) ** 2


def _to_int16(pcm: np.ndarray) -> np.ndarray:
    pcm = np.asarray(pcm)
    if pcm.ndim != 1:
        raise ValueError(f"outbound audio must be mono 1-D PCM, got shape {pcm.shape}")
    if pcm.dtype == np.int16:
        return pcm
    if np.issubdtype(pcm.dtype, np.floating):
        return (np.clip(pcm, -1.0, 1.0) * 32767.0).astype(np.int16)
    raise ValueError(f"outbound audio must be int16 or float in [-1, 1], got {pcm.dtype}")


class _Resampler:
    """Streaming conversion of one source rate to 48 kHz mono s16 (keeps filter state
    between writes, so chunk boundaries do not click)."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._resampler = (
            None if rate == SAMPLE_RATE
            else av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        )

    def convert(self, pcm: np.ndarray) -> np.ndarray:
        if self._resampler is None:
            return pcm.copy()  # the caller may reuse its buffer while this waits in the queue
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.rate
        out = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        if not out:
            return np.zeros(0, dtype=np.int16)
        return out[0] if len(out) == 1 else np.concatenate(out)


class OutboundAudioTrack(MediaStreamTrack):
    """The agent's voice as an aiortc audio track: 20 ms frames of 48 kHz mono s16, paced."""

    kind = "audio"

    def __init__(
        self,
        max_queue_ms: int = 30_000,
        on_playing_changed: Callable[[bool], None] | None = None,
    ) -> None:
        super().__init__()
        if max_queue_ms < FRAME_MS:
            raise ValueError(f"max_queue_ms must be >= {FRAME_MS}")
        self.on_playing_changed = on_playing_changed
        self._max_queue = max_queue_ms * SAMPLE_RATE // 1000
        self._chunks: deque[np.ndarray] = deque()
        self._head = 0  # samples of _chunks[0] already sent
        self._queued = 0  # samples queued, not yet sent
        self._played = 0  # agent samples handed to the sender, cumulative
        self._playing = False
        self._resamplers: dict[int, _Resampler] = {}
        self._generation = 0  # bumped by flush(): writes from before it stop queuing
        self._fade: np.ndarray | None = None  # a flush's fade-out, sent next (not agent audio)
        self._space = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._frame_index = 0
        self._start: float | None = None

    @property
    def played_ms(self) -> int:
        """Agent audio (not silence) handed to the sender so far in this call."""
        return self._played * 1000 // SAMPLE_RATE

    @property
    def queued_ms(self) -> int:
        return self._queued * 1000 // SAMPLE_RATE

    @property
    def playing(self) -> bool:
        """True while queued agent audio is being sent."""
        return self._playing

    async def write(self, pcm: np.ndarray, sample_rate: int) -> None:
        """Queue mono PCM (int16, or float in [-1, 1]) at any rate for playback.

        Waits while the queue holds `max_queue_ms`; a write longer than the queue is queued
        piece by piece as playback frees room. A flush() during the wait ends the write
        without queuing the rest. Raises MediaStreamError once the track is stopped.
        """
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate}")
        self._check_live()
        pcm = _to_int16(pcm)
        # Taken before the lock: a flush while this write waits for its turn cancels it too.
        generation = self._generation
        async with self._write_lock:
            step = max(1, sample_rate * WRITE_SLICE_MS // 1000)
            for begin in range(0, len(pcm), step):
                self._check_live()
                if generation != self._generation:
                    return
                # Resampler lookup per slice: a flush replaces it (dropping its filter tail).
                converted = self._resampler(sample_rate).convert(pcm[begin:begin + step])
                if not await self._enqueue(converted, generation):
                    return
                await asyncio.sleep(0)  # a long write yields to the pacer between slices

    def flush(self) -> int:
        """Drop all queued audio now (barge-in); returns the ms dropped. The next frame fades
        out what would have played (module doc). Wakes blocked writers."""
        dropped = self._queued
        self._fade = self._faded_next_frame() if self._playing else None
        self._chunks.clear()
        self._head = 0
        self._queued = 0
        self._resamplers.clear()
        self._generation += 1
        self._space.set()
        if self._playing:
            self._set_playing(False)
        if dropped:
            logger.debug("flushed %d ms of queued agent audio", dropped * 1000 // SAMPLE_RATE)
        return dropped * 1000 // SAMPLE_RATE

    def stop(self) -> None:
        """End the track: recv() and write() raise MediaStreamError from now on."""
        if self.readyState == "live":
            self.flush()
        super().stop()
        self._space.set()

    async def recv(self) -> av.AudioFrame:
        """The next 20 ms frame, released at start + n * 20 ms; silence when nothing is queued."""
        self._check_live()
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._start is None:
            self._start = now
        else:
            self._frame_index += 1
            due = self._start + self._frame_index * _FRAME_S
            if now - due > MAX_LAG_FRAMES * _FRAME_S:
                logger.warning("outbound audio fell %.0f ms behind its clock; re-anchoring",
                               (now - due) * 1000)
                self._start = now - self._frame_index * _FRAME_S
            elif due > now:
                await asyncio.sleep(due - now)
            # How late this frame leaves against its clock: a late loop makes every call late.
            pacing_lateness.observe(loop.time() - due)
            self._check_live()
        return self._next_frame()

    def _next_frame(self) -> av.AudioFrame:
        samples, audio = self._take()
        if audio and not self._playing:
            self._set_playing(True)
        elif not audio and self._playing:
            self._set_playing(False)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        frame.pts = self._frame_index * FRAME_SAMPLES
        frame.time_base = TIME_BASE
        return frame

    def _faded_next_frame(self) -> np.ndarray | None:
        """The queued audio's next FADE_MS, faded to silence; None if none is queued."""
        parts, need = [], len(_FADE)
        for i, chunk in enumerate(self._chunks):
            part = chunk[self._head if i == 0 else 0:][:need]
            parts.append(part)
            need -= len(part)
            if not need:
                break
        if not parts:
            return None
        pcm = np.concatenate(parts)
        faded: np.ndarray = (pcm * _FADE[:len(pcm)]).astype(np.int16)
        return faded

    def _take(self) -> tuple[np.ndarray, int]:
        """Pop up to one frame of queued audio, padded with silence; returns (frame, n audio).
        A flush's fade-out goes first, counted as no audio (the reply was already cut)."""
        if self._fade is not None:
            samples = np.zeros(FRAME_SAMPLES, dtype=np.int16)
            samples[:len(self._fade)] = self._fade
            self._fade = None
            return samples, 0
        if self._chunks:
            chunk = self._chunks[0]
            if len(chunk) - self._head >= FRAME_SAMPLES:  # common case: one slice, one copy
                samples = chunk[self._head:self._head + FRAME_SAMPLES]
                self._advance(FRAME_SAMPLES)
                return samples, FRAME_SAMPLES
        samples = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        filled = 0
        while filled < FRAME_SAMPLES and self._chunks:
            chunk = self._chunks[0]
            n = min(len(chunk) - self._head, FRAME_SAMPLES - filled)
            samples[filled:filled + n] = chunk[self._head:self._head + n]
            filled += n
            self._advance(n)
        return samples, filled

    def _advance(self, n: int) -> None:
        self._head += n
        self._queued -= n
        self._played += n
        if self._head >= len(self._chunks[0]):
            self._chunks.popleft()
            self._head = 0
        if self._queued < self._max_queue:
            self._space.set()

    async def _enqueue(self, pcm: np.ndarray, generation: int) -> bool:
        """Queue `pcm` in pieces that fit; False if a flush or stop intervened."""
        begin = 0
        while begin < len(pcm):
            while self._queued >= self._max_queue:
                self._space.clear()
                await self._space.wait()
                self._check_live()
                if generation != self._generation:
                    return False
            n = min(len(pcm) - begin, self._max_queue - self._queued)
            self._chunks.append(pcm[begin:begin + n])
            self._queued += n
            begin += n
        return True

    def _resampler(self, rate: int) -> _Resampler:
        resampler = self._resamplers.get(rate)
        if resampler is None:
            resampler = self._resamplers[rate] = _Resampler(rate)
        return resampler

    def _set_playing(self, playing: bool) -> None:
        self._playing = playing
        callback = self.on_playing_changed
        if callback is None:
            return
        try:
            callback(playing)
        except Exception:  # a broken listener must not stop the media path
            logger.exception("on_playing_changed callback failed")

    def _check_live(self) -> None:
        if self.readyState != "live":
            raise MediaStreamError
