"""A real aiortc caller for tests: sends audio from a numpy array at real-time pace, records
what the server plays back, and collects the server's `oai-events`."""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import time
from typing import Any

import av
import httpx
import numpy as np
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError

FRAME_MS = 20


class ArrayAudioTrack(MediaStreamTrack):
    """Plays int16 mono PCM in 20 ms frames on a real-time clock, then silence (or ends)."""

    kind = "audio"

    def __init__(self, pcm: np.ndarray, rate: int = 48_000, loop_silence: bool = True) -> None:
        super().__init__()
        self.rate = rate
        self.samples_per_frame = rate * FRAME_MS // 1000
        self._pcm = pcm.astype(np.int16)
        self._pos = 0
        self._n = 0
        self._start: float | None = None
        self._loop_silence = loop_silence
        self.started_at: float | None = None  # loop time of the first frame

    def replace(self, pcm: np.ndarray) -> None:
        """Start playing new audio from the next frame."""
        self._pcm, self._pos = pcm.astype(np.int16), 0

    @property
    def position_ms(self) -> int:
        return self._n * FRAME_MS

    async def recv(self) -> av.AudioFrame:
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = self.started_at = loop.time()
        due = self._start + self._n * FRAME_MS / 1000
        await asyncio.sleep(max(0.0, due - loop.time()))
        chunk = self._pcm[self._pos : self._pos + self.samples_per_frame]
        self._pos += len(chunk)
        if len(chunk) < self.samples_per_frame:
            if not self._loop_silence and len(chunk) == 0:
                self.stop()
                raise MediaStreamError
            chunk = np.pad(chunk, (0, self.samples_per_frame - len(chunk)))
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.rate
        frame.pts = self._n * self.samples_per_frame
        frame.time_base = fractions.Fraction(1, self.rate)
        self._n += 1
        return frame


class RtcCaller:
    """One simulated caller."""

    def __init__(self, base_url: str, audio: ArrayAudioTrack, codecs: tuple[str, ...] = ()):
        self.base_url = base_url
        self.audio = audio
        self.codecs = codecs
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.received: list[np.ndarray] = []  # 48 kHz mono int16 frames, in arrival order
        self.received_at: list[float] = []
        self.received_pts: list[int] = []  # RTP time (48 kHz samples) of each received frame
        self.location: str | None = None
        self._event_arrived = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.channel = self.pc.createDataChannel("oai-events")
        self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)

    async def connect(self, headers: dict[str, str] | None = None) -> None:
        """Place the call (`headers` go with the offer, e.g. a resume token)."""
        transceiver = self.pc.addTransceiver(self.audio, direction="sendrecv")
        if self.codecs:
            caps = RTCRtpSender.getCapabilities("audio").codecs
            transceiver.setCodecPreferences([c for c in caps if c.name in self.codecs])
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with httpx.AsyncClient(base_url=self.base_url) as http:
            reply = await http.post(
                "/v1/realtime/calls",
                content=self.pc.localDescription.sdp,
                headers={"Content-Type": "application/sdp", **(headers or {})},
            )
        assert reply.status_code == 201, reply.text
        self.location = reply.headers["location"]
        await self.pc.setRemoteDescription(RTCSessionDescription(reply.text, "answer"))

    @property
    def call_id(self) -> str:
        """The call's id on the server: the last part of its location (once connected)."""
        assert self.location is not None, "the caller has not connected"
        return self.location.rsplit("/", 1)[1]

    def _on_message(self, message: str) -> None:
        self.events.append((time.monotonic(), json.loads(message)))
        self._event_arrived.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        self._tasks.append(asyncio.ensure_future(self._drain(track)))

    async def _drain(self, track: MediaStreamTrack) -> None:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=48_000)
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if not isinstance(frame, av.AudioFrame):  # the agent sends audio alone
                    raise TypeError(f"the agent's track gave a {type(frame).__name__}, "
                                    "not an audio frame")
                for out in resampler.resample(frame):
                    self.received.append(out.to_ndarray().reshape(-1).copy())
                    self.received_at.append(time.monotonic())
                    self.received_pts.append(int(frame.pts or 0))

    def send(self, event: dict[str, Any] | str) -> None:
        self.channel.send(event if isinstance(event, str) else json.dumps(event))

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        return [e for _, e in self.events if e["type"] == event_type]

    async def wait_for(self, event_type: str, timeout: float = 10.0, count: int = 1) -> dict:
        """The count-th event of this type, waiting for it to arrive."""
        deadline = time.monotonic() + timeout
        while len(self.of_type(event_type)) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                seen = [e["type"] for _, e in self.events]
                raise TimeoutError(f"no {event_type!r} (x{count}) in {timeout} s; saw {seen}")
            self._event_arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event_arrived.wait(), remaining)
        return self.of_type(event_type)[count - 1]

    def loud_bursts(self, threshold: int, min_gap_ms: int = 400) -> list[int]:
        """Milliseconds of loud audio in each burst the caller received, in stream (RTP) order;
        bursts are split by silences of at least min_gap_ms. Independent of arrival jitter."""
        loud = sorted(p for p, f in zip(self.received_pts, self.received, strict=True)
                      if np.abs(f).max() > threshold)
        bursts: list[int] = []
        previous = None
        for pts in loud:
            if previous is None or pts - previous > min_gap_ms * 48:
                bursts.append(0)
            bursts[-1] += FRAME_MS
            previous = pts
        return bursts

    def received_pcm(self) -> np.ndarray:
        return np.concatenate(self.received) if self.received else np.zeros(0, np.int16)

    async def hang_up(self) -> None:
        if self.location:
            async with httpx.AsyncClient(base_url=self.base_url) as http:
                await http.delete(self.location)
        await self.close()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.pc.close()


async def dead_peer_offer() -> str:
    """A real SDP offer with audio and a data channel, from a peer closed at once: nobody
    answers its ICE checks, so the call it places never connects."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp
