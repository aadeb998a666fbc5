"""Audio on a Realtime WebSocket, base64 in the events both ways, in the format the session chose
(`session.audio.input.format`, `.output.format`): pcm16 at 24 kHz (OpenAI's `audio/pcm`, the
default), or G.711 at 8 kHz, one byte a sample (`audio/pcmu`, `audio/pcma`: what telephony
gateways stream; media/g711.py).

The caller's appends are resampled (PyAV, streaming) to the 16 kHz 20 ms frames the VAD takes;
the agent's audio is resampled to the format's rate and sent as fast as it comes, while a
playout clock estimates what the client has played (real time from the first delta after a
pause), which is what barge-in and truncation go by, and bounds how far ahead of it the agent
may be.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import Callable

import av
import numpy as np

from media import g711
from media.audio_format import FRAME_SAMPLES

WIRE_RATE = 24_000  # Hz: pcm16 mono little-endian, the Realtime API's audio/pcm
PCM = "audio/pcm"
G711_LAWS: dict[str, g711.Law] = {"audio/pcmu": "pcmu", "audio/pcma": "pcma"}


def pcm16(pcm: np.ndarray) -> np.ndarray:
    """Mono int16 from int16, or from float samples in [-1, 1]."""
    if np.issubdtype(pcm.dtype, np.floating):
        return np.round(np.clip(pcm, -1.0, 1.0) * 32767.0).astype(np.int16)
    return pcm.astype(np.int16, copy=False)


def decode_pcm16(audio: str) -> np.ndarray:
    """The samples of a base64 pcm16 string; ValueError saying what is wrong with it."""
    try:
        raw = base64.b64decode(audio, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"audio is not base64: {exc}") from None
    if len(raw) % 2:
        raise ValueError("audio is not whole 16-bit samples")
    return np.frombuffer(raw, dtype="<i2").astype(np.int16)


def encode_pcm16(pcm: np.ndarray) -> str:
    return base64.b64encode(pcm.astype("<i2").tobytes()).decode("ascii")


class WireFormat:
    """One of the session's audio formats (OpenAI's name: audio/pcm, audio/pcmu, audio/pcma):
    base64 text to and from mono int16 at its `rate`."""

    def __init__(self, name: str) -> None:
        law = G711_LAWS.get(name)
        if law is None and name != PCM:
            raise ValueError(f"no audio format {name!r}")
        self.name = name
        self.rate = WIRE_RATE if law is None else g711.RATE
        self._g711 = g711.G711(law) if law is not None else None

    def ms(self, samples: int) -> float:
        """How long `samples` of this format play."""
        return samples * 1000 / self.rate

    def decode(self, audio: str) -> np.ndarray:
        """The samples of a base64 string; ValueError saying what is wrong with it."""
        if self._g711 is None:
            return decode_pcm16(audio)
        try:
            raw = base64.b64decode(audio, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"audio is not base64: {exc}") from None
        return self._g711.decode(raw)

    def encode(self, pcm: np.ndarray) -> str:
        """Mono int16 at `rate` as base64."""
        if self._g711 is None:
            return encode_pcm16(pcm)
        return base64.b64encode(self._g711.encode(pcm)).decode("ascii")


class Resampler:
    """Streaming conversion of mono int16 to `rate` (filter state kept between pieces, so their
    boundaries do not click); one PyAV resampler per source rate."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._by_source: dict[int, av.AudioResampler] = {}

    def convert(self, pcm: np.ndarray, source_rate: int) -> np.ndarray:
        if source_rate == self.rate:
            return pcm.copy()
        resampler = self._by_source.get(source_rate)
        if resampler is None:
            resampler = av.AudioResampler(format="s16", layout="mono", rate=self.rate)
            self._by_source[source_rate] = resampler
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = source_rate
        pieces = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
        return np.concatenate(pieces) if pieces else np.zeros(0, np.int16)

    def reset(self) -> None:
        """Forget the filters' tails (after a flush, the next audio is not their sequel)."""
        self._by_source.clear()


class InputFrames:
    """A client's appended audio (24 kHz, or 8 kHz G.711 decoded) as 16 kHz 20 ms frames for
    the VAD."""

    def __init__(self, on_frame: Callable[[np.ndarray], None]) -> None:
        self._on_frame = on_frame
        self._resampler = Resampler(16_000)
        self._carry = np.zeros(0, np.int16)  # under one frame, waiting for the next append

    def push(self, pcm: np.ndarray, rate: int = WIRE_RATE) -> None:
        samples = np.concatenate([self._carry, self._resampler.convert(pcm, rate)])
        whole = len(samples) // FRAME_SAMPLES * FRAME_SAMPLES
        self._carry = samples[whole:].copy()
        for begin in range(0, whole, FRAME_SAMPLES):
            self._on_frame(samples[begin:begin + FRAME_SAMPLES])


class PlayoutClock:
    """The agent's audio as a WebSocket client plays it, estimated: each chunk sent plays after
    the ones before it, in real time. The session's view of the call's outbound audio."""

    on_playing_changed: Callable[[bool], None] | None = None  # no edges: WebRTC's events only

    def __init__(self, max_queue_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_queue_ms = max_queue_ms
        self._clock = clock
        self._sent_ms = 0.0  # agent audio sent so far, less what a flush took back
        self._ends_at = clock()  # when the audio sent so far has played
        self._generation = 0  # bumped by flush(): a write waiting for room gives up

    @property
    def queued_ms(self) -> int:
        return int(max(0.0, self._ends_at - self._clock()) * 1000)

    @property
    def played_ms(self) -> int:
        return int(self._sent_ms) - self.queued_ms

    @property
    def playing(self) -> bool:
        return self.queued_ms > 0

    @property
    def flushes(self) -> int:
        return self._generation

    async def room(self) -> bool:
        """Wait until the client is less than max_queue_ms ahead; False if flushed meanwhile."""
        generation = self._generation
        while self.queued_ms > self.max_queue_ms:
            await asyncio.sleep((self.queued_ms - self.max_queue_ms) / 1000)
            if generation != self._generation:
                return False
        return generation == self._generation

    def sent(self, ms: float) -> None:
        """`ms` more of agent audio went to the client."""
        self._ends_at = max(self._ends_at, self._clock()) + ms / 1000
        self._sent_ms += ms

    def flush(self) -> int:
        """The client is told to drop what it has not played: the clock stops there."""
        dropped = self.queued_ms
        self._sent_ms -= dropped
        self._ends_at = self._clock()
        self._generation += 1
        return dropped
