"""The caller's incoming audio: one remote track, always drained, cut into 16 kHz 20 ms frames.

aiortc queues decoded frames without limit when nobody reads a remote track, so `InboundAudio`
reads for as long as the track lives, whatever its consumer does with the frames, and drops the
oldest frames when a caller sends faster than they can be consumed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from media.aiortc_internals import remote_track_queue
from media.audio_format import FRAME_SAMPLES, SAMPLE_RATE

logger = logging.getLogger(__name__)

# Decoded frames allowed to wait in the track's queue (5 s of 20 ms packets, about 1 MiB at
# 48 kHz stereo): a caller sending faster than real time, or a stalled loop, costs this much
# memory at most; beyond it the oldest half is dropped.
MAX_BACKLOG_FRAMES = 250


class InboundAudio:
    """Drains one remote aiortc audio track: decode, resample to 16 kHz mono int16,
    cut into 20 ms frames."""

    def __init__(self, track: MediaStreamTrack, on_frame: Callable[[np.ndarray], None]) -> None:
        self._track = track
        # aiortc's queue for a remote track (None for other tracks: nothing to bound), looked
        # up here so an aiortc without it fails the call's setup, not its draining.
        self._backlog = remote_track_queue(track)
        self._on_frame = on_frame
        self._resampler: av.AudioResampler | None = None
        self._source: tuple[str, str, int] | None = None  # (format, layout, rate) of the input
        self._carry = np.zeros(0, dtype=np.int16)  # < FRAME_SAMPLES samples left over
        self._frames_in = 0
        self._frames_out = 0
        self._frames_dropped = 0

    @property
    def frames_in(self) -> int:
        """Decoded audio frames read from the track so far."""
        return self._frames_in

    @property
    def frames_dropped(self) -> int:
        """Frames dropped unread because the track's backlog grew past MAX_BACKLOG_FRAMES."""
        return self._frames_dropped

    @property
    def frames_out(self) -> int:
        """20 ms frames (320 samples at 16 kHz) handed to on_frame so far."""
        return self._frames_out

    async def run(self) -> None:
        """Read the track until it ends, calling on_frame for every 20 ms of audio."""
        while True:
            try:
                frame = await self._track.recv()
            except MediaStreamError:
                break
            self._frames_in += 1
            self._drop_backlog()
            try:
                if not isinstance(frame, av.AudioFrame):  # an audio track yields only these
                    raise TypeError(f"an audio track gave a {type(frame).__name__}")
                self._emit(self._resample(frame))
            except Exception:  # one bad frame must not stop the draining
                logger.exception("inbound audio frame %d could not be converted", self._frames_in)
        self._emit(self._flush_resampler())
        logger.debug("inbound track ended after %d frames in, %d out",
                     self._frames_in, self._frames_out)

    def _drop_backlog(self) -> None:
        """Bound the frames aiortc holds for this track (its queue has no bound of its own)."""
        queue = self._backlog
        if queue is None or queue.qsize() <= MAX_BACKLOG_FRAMES:
            return
        dropped = 0
        while queue.qsize() > MAX_BACKLOG_FRAMES // 2:
            frame = queue.get_nowait()
            if frame is None:  # the end of the track is always last: leave it for recv()
                queue.put_nowait(None)
                break
            dropped += 1
        self._frames_dropped += dropped
        logger.warning("inbound audio %d frames behind: dropped the oldest %d",
                       dropped + queue.qsize(), dropped)

    def _resample(self, frame: av.AudioFrame) -> list[np.ndarray]:
        source = (frame.format.name, frame.layout.name, frame.sample_rate)
        if source != self._source:
            # A new codec (or a renegotiation) changes the input; PyAV's resampler is bound
            # to the first frame's parameters, so its tail is flushed and a new one made.
            tail = self._flush_resampler()
            if self._source is not None:
                logger.info("inbound audio changed from %s to %s", self._source, source)
            self._source = source
            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
            first = self._convert(frame)
            return [*tail, self._padding(tail + first), *first]
        return self._convert(frame)

    def _padding(self, pieces: list[np.ndarray]) -> np.ndarray:
        """Zeros that make the carry and `pieces` whole frames. A new resampler's first output
        is short of a frame by its filter's delay (304 of 320 samples from 48 kHz, 288 from
        8 kHz), then a whole frame per frame: padded once where it starts, each later frame
        goes out whole as it comes. Carried instead, the remainder would hold every frame, and
        the VAD's every decision, back by 19 ms."""
        short = -(len(self._carry) + sum(len(p) for p in pieces)) % FRAME_SAMPLES
        return np.zeros(short, dtype=np.int16)

    def _convert(self, frame: av.AudioFrame | None) -> list[np.ndarray]:
        assert self._resampler is not None
        return [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]

    def _flush_resampler(self) -> list[np.ndarray]:
        if self._resampler is None:
            return []
        try:
            tail = self._convert(None)
        except Exception:
            logger.exception("flushing the inbound resampler failed")
            tail = []
        self._resampler = None
        self._source = None
        return tail

    def _emit(self, pieces: list[np.ndarray]) -> None:
        pieces = [p for p in pieces if p.size]
        if not pieces:
            return
        if not self._carry.size and len(pieces) == 1 and len(pieces[0]) == FRAME_SAMPLES:
            self._send(pieces[0])  # the common case: one whole frame, nothing carried
            return
        samples = np.concatenate([self._carry, *pieces])
        whole = len(samples) // FRAME_SAMPLES * FRAME_SAMPLES
        # Copied so the carry does not pin the whole block in memory.
        self._carry = samples[whole:].copy()
        for begin in range(0, whole, FRAME_SAMPLES):
            self._send(samples[begin:begin + FRAME_SAMPLES])

    def _send(self, frame: np.ndarray) -> None:
        self._frames_out += 1
        try:
            self._on_frame(frame)
        except Exception:  # the consumer's failure must not stop the draining
            logger.exception("on_frame failed for inbound frame %d", self._frames_out)
