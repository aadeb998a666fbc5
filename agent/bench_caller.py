"""The caller of `omnivox bench turn`: a real aiortc peer that speaks, listens and keeps time.

Its microphone is an `OutboundAudioTrack` (paced 20 ms frames, any source rate), so it knows
when its last word left; the agent's audio is drained by `InboundAudio`, and the arrival of the
first non-silent frame after each question is noted. Server events arrive on `oai-events`
with their arrival times. Times are `time.monotonic()`, the clock of the server's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCSessionDescription

from media.inbound import InboundAudio
from media.outbound import OutboundAudioTrack
from media.peer import new_peer_connection

MAX_EVENTS = 10_000  # events kept (a bench call makes a few dozen per turn)


class BenchCaller:
    """One call to an omnivox server, driven turn by turn."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.pc = new_peer_connection([])
        self.mic = OutboundAudioTrack(max_queue_ms=30_000, on_playing_changed=self._mic_changed)
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.speech_ended_at: float | None = None  # the question's last sample was sent
        self.first_audio_at: float | None = None  # the first agent audio after the question
        self.location: str | None = None
        self._arrived = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._channel = self.pc.createDataChannel("oai-events")
        self._channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)

    async def connect(self, timeout_s: float = 30.0) -> None:
        """Offer, post it to the server, apply the answer; wait for `session.created`."""
        self.pc.addTransceiver(self.mic, direction="sendrecv")
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s) as http:
            reply = await http.post("/v1/realtime/calls", content=self.pc.localDescription.sdp,
                                    headers={"Content-Type": "application/sdp"})
        reply.raise_for_status()
        self.location = reply.headers["location"]
        await self.pc.setRemoteDescription(RTCSessionDescription(reply.text, "answer"))
        await self.wait_for("session.created", 1, timeout_s)

    @property
    def call_id(self) -> str:
        assert self.location is not None, "not connected"
        return self.location.rsplit("/", 1)[1]

    async def say(self, pcm: np.ndarray, sample_rate: int) -> None:
        """Speak `pcm` into the call (returns once it is queued; it plays in real time)."""
        self.speech_ended_at = self.first_audio_at = None
        await self.mic.write(pcm, sample_rate)

    def count(self, event_type: str) -> int:
        return sum(1 for _, event in self.events if event["type"] == event_type)

    def last(self, event_type: str) -> tuple[float, dict[str, Any]]:
        """The latest event of this type and its arrival time."""
        return next((at, e) for at, e in reversed(self.events) if e["type"] == event_type)

    async def wait_for(self, event_type: str, count: int, timeout_s: float) -> dict[str, Any]:
        """Wait until `count` events of this type have arrived; the latest of them."""
        deadline = time.monotonic() + timeout_s
        while self.count(event_type) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {event_type} (#{count}) within {timeout_s:.0f} s")
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)
        return self.last(event_type)[1]

    async def hang_up(self) -> None:
        if self.location:
            with contextlib.suppress(httpx.HTTPError):
                async with httpx.AsyncClient(base_url=self.base_url) as http:
                    await http.delete(self.location)
        for task in self._tasks:
            task.cancel()
        self.mic.stop()
        await self.pc.close()

    def _on_message(self, message: str | bytes) -> None:
        if len(self.events) < MAX_EVENTS:
            self.events.append((time.monotonic(), json.loads(message)))
        self._arrived.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._tasks.append(asyncio.ensure_future(InboundAudio(track, self._heard).run()))

    def _heard(self, frame: np.ndarray) -> None:
        waiting = self.speech_ended_at is not None and self.first_audio_at is None
        if waiting and frame.any():
            self.first_audio_at = time.monotonic()

    def _mic_changed(self, playing: bool) -> None:
        if not playing:
            self.speech_ended_at = time.monotonic()
