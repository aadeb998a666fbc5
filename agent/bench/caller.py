"""The caller of `omnivox bench turn` and `omnivox bench calls`: a real aiortc peer that speaks,
listens and keeps time the way a caller feels it.

Both ends of a measurement are taken on the media timeline, in `time.monotonic()` (the clock of
every asyncio loop on the machine):

- what the caller says goes out through a `Microphone` (paced 20 ms frames at 16 kHz, silence
  between utterances); an utterance's onset is the moment its first frame is handed to the
  sender and its end the moment its last sample is due (the frame after it, less that frame's
  padding). 16 kHz rather than 48: aiortc computes every outgoing frame's audio level in a
  Python loop over its samples, and a load generator with dozens of callers must not spend
  its CPU there;
- what the caller hears is timed by the arrival of the RTP packet that carried it, not by when
  aiortc's jitter buffer (4 packets of prefetch: 80 ms) and decoder thread hand the frame over:
  the server's part ends when its packet arrives. A received sample is "loud" above `LOUD`.
  Silences inside a reply are measured in the stream's own media time (RTP timestamps: what
  the server sent), and late packets separately (arrival against the stream's pace).

Server events arrive on `oai-events` with their arrival times. Memory is bounded for calls of
any length: the latest event of each type, the events of the last few responses, and the last
`MAX_FRAMES` received frames (two minutes) are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import av
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCRtpReceiver, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from aiortc.rtp import RtpPacket

from agent.bench.microphone import Microphone, Utterance
from agent.bench.speech import MIC_RATE, resample
from media.aiortc_internals import watch_rtp_packets
from media.peer import new_peer_connection

LOUD = 100  # |sample| above this (-50 dBFS) is sound; codecs decode digital silence to ~0
MAX_FRAMES = 6_000  # received frames kept: two minutes of 20 ms frames
MAX_RESPONSES = 8  # responses whose events are kept by id
MAX_ERRORS = 50  # error events kept (all are counted)
RECENT_EVENTS = 2_000  # the last events kept in arrival order, for inspection
_RTP_KEPT = 512  # packet arrival times awaiting their decoded frame (16 fit in the buffer)
CODECS = ("opus", "PCMU", "PCMA")


class CallDroppedError(RuntimeError):
    """The call's connection failed or closed while the caller was still on it."""


@dataclass
class Heard:
    """One received audio frame: when its packet arrived and where its sound lies in it."""

    at: float  # arrival of the packet (monotonic s): the frame's first sample
    media: float  # the frame's place in the stream (RTP timestamp, s)
    duration: float  # seconds of audio in the frame
    first_loud: float | None  # seconds into the frame of its first loud sample, if any
    last_loud: float | None  # seconds into the frame of the end of its last loud sample

    @property
    def loud_from(self) -> float | None:
        return None if self.first_loud is None else self.at + self.first_loud

    @property
    def loud_until(self) -> float | None:
        return None if self.last_loud is None else self.at + self.last_loud


class BenchCaller:
    """One call to an omnivox server, driven turn by turn."""

    def __init__(self, base_url: str, api_key: str | None = None,
                 codec: str | None = None) -> None:
        if codec is not None and codec not in CODECS:
            raise ValueError(f"codec must be one of {', '.join(CODECS)}, not {codec!r}")
        self.base_url = base_url
        self.codec = codec
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.pc = new_peer_connection([])
        self.mic = Microphone(self._mic_changed)
        self.counts: Counter[str] = Counter()
        self.latest: dict[str, tuple[float, dict[str, Any]]] = {}
        self.recent: deque[tuple[float, dict[str, Any]]] = deque(maxlen=RECENT_EVENTS)
        self.responses: OrderedDict[str, dict[str, tuple[float, dict[str, Any]]]] = OrderedDict()
        self.created: deque[tuple[float, str]] = deque(maxlen=MAX_RESPONSES)
        self.errors: list[dict[str, Any]] = []
        self.heard: deque[Heard] = deque(maxlen=MAX_FRAMES)
        self.utterance: Utterance | None = None  # the latest thing said
        self.speech_ended_at: float | None = None  # the latest utterance's last sample was due
        self.first_audio_at: float | None = None  # the first loud sample heard after that
        self.location: str | None = None
        self.dropped = False  # the connection failed or closed without our hanging up
        self.drop_reason: str | None = None
        self.dropped_at: float | None = None
        self.rtp_misses = 0  # frames timed by their decoding (no packet arrival found)
        self._hanging_up = False
        self._changed = asyncio.Event()
        self._was_loud = False
        self._tasks: list[asyncio.Task[None]] = []
        self._rtp_arrivals: OrderedDict[int, float] = OrderedDict()
        self._rtp_origin: int | None = None
        self._media_end = 0.0  # where the last received frame ended in the stream (s)
        self._channel = self.pc.createDataChannel("oai-events")
        self._channel.on("message", self._on_message)
        self._channel.on("close", self._on_closed)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_connection_state)

    # -- connection ---------------------------------------------------------------------

    async def connect(self, timeout_s: float = 30.0) -> None:
        """Offer, post it to the server, apply the answer; wait for `session.created`.
        Raises httpx.HTTPStatusError when the server refuses the call (e.g. 503 when full)."""
        transceiver = self.pc.addTransceiver(self.mic, direction="sendrecv")
        if self.codec is not None:
            capabilities = RTCRtpSender.getCapabilities("audio").codecs
            transceiver.setCodecPreferences([c for c in capabilities if c.name == self.codec])
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s,
                                     headers=self._headers) as http:
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

    async def call_record(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The server's record of this call so far (`GET /v1/calls/{id}`: its turns' stamps)."""
        async with httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s,
                                     headers=self._headers) as http:
            reply = await http.get(f"/v1/calls/{self.call_id}")
        reply.raise_for_status()
        record: dict[str, Any] = reply.json()
        return record

    def send(self, event: dict[str, Any]) -> None:
        self._channel.send(json.dumps(event))

    async def hang_up(self, timeout_s: float = 10.0) -> None:
        """DELETE the call, then close the peer connection (each bounded: a broken connection
        must not hold the caller forever)."""
        if self._hanging_up:
            return
        self._hanging_up = True
        if self.location:
            with contextlib.suppress(httpx.HTTPError):
                async with httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s,
                                             headers=self._headers) as http:
                    await http.delete(self.location)
        for task in self._tasks:
            task.cancel()
        self.mic.stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.pc.close(), timeout_s)

    # -- speaking -----------------------------------------------------------------------

    async def say(self, pcm: np.ndarray, sample_rate: int) -> Utterance:
        """Speak `pcm` into the call (it plays in real time from the next frame); the
        utterance, whose onset and end fill in as it plays. The audio should start and end with
        its audible part: its first frame is its onset, its last sample its end."""
        if sample_rate != MIC_RATE:
            pcm = await asyncio.to_thread(resample, pcm, sample_rate)
        self.utterance = Utterance(len(pcm))
        self.speech_ended_at = self.first_audio_at = None
        self.mic.say(pcm)
        return self.utterance

    def _mic_changed(self, playing: bool, at: float) -> None:
        """The microphone's speech started or ended at `at` (monotonic, on the media timeline:
        the edge frame's due time, however late it was sent)."""
        utterance = self.utterance
        if utterance is None:
            return
        if playing and utterance.onset is None:
            utterance.onset = at
        elif not playing and utterance.onset is not None and utterance.end is None:
            utterance.end = at - utterance.padding_s
            self.speech_ended_at = utterance.end
        self._notify()

    # -- events -------------------------------------------------------------------------

    def count(self, event_type: str) -> int:
        return self.counts[event_type]

    def last(self, event_type: str) -> tuple[float, dict[str, Any]]:
        """The latest event of this type and its arrival time."""
        return self.latest[event_type]

    def response_event(self, response_id: str, event_type: str
                       ) -> tuple[float, dict[str, Any]] | None:
        """The event of this type for one response (if it arrived), with its arrival."""
        return self.responses.get(response_id, {}).get(event_type)

    def response_created_after(self, t: float) -> tuple[float, str] | None:
        """The first response created (arrival, id) after monotonic time t."""
        return next(((at, rid) for at, rid in self.created if at > t), None)

    async def wait_for(self, event_type: str, count: int, timeout_s: float) -> dict[str, Any]:
        """Wait until `count` events of this type have arrived; the latest of them."""
        await self.wait_until(lambda: self.counts[event_type] >= count, timeout_s,
                              f"{event_type} (#{count})")
        return self.latest[event_type][1]

    async def wait_until(self, condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """Wait until `condition()` is truthy (checked whenever an event, an utterance edge or
        a change between sound and silence arrives); its value. Raises CallDroppedError if
        the call drops first, TimeoutError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = condition()
            if value:
                return value
            if self.dropped:
                raise CallDroppedError(f"the call dropped while waiting for {what}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {what} within {timeout_s:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    def _notify(self) -> None:
        """Wake every waiter (each waits on the event current when it looked)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _on_message(self, message: str | bytes) -> None:
        at, event = time.monotonic(), json.loads(message)
        kind = event.get("type", "")
        self.counts[kind] += 1
        self.latest[kind] = (at, event)
        self.recent.append((at, event))
        if kind == "error" and len(self.errors) < MAX_ERRORS:
            self.errors.append(event)
        response_id = event.get("response_id") or (event.get("response") or {}).get("id")
        if response_id:
            if kind == "response.created":
                self.created.append((at, response_id))
            events = self.responses.setdefault(response_id, {})
            events.setdefault(kind, (at, event))  # the first of each type for this response
            self.responses.move_to_end(response_id)
            while len(self.responses) > MAX_RESPONSES:
                self.responses.popitem(last=False)
        self._notify()

    def _on_closed(self) -> None:
        self._drop("the events channel closed")

    def _on_connection_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self._drop(f"connection {self.pc.connectionState}")

    def _drop(self, reason: str) -> None:
        if self._hanging_up or self.dropped:
            return
        self.dropped, self.drop_reason, self.dropped_at = True, reason, time.monotonic()
        self._notify()

    # -- listening ----------------------------------------------------------------------

    def first_loud_after(self, t: float) -> float | None:
        """When the first loud sample heard at or after monotonic time t arrived."""
        for frame in self.heard:
            start = frame.loud_from
            if start is None or frame.at + frame.duration < t:
                continue
            if start >= t:
                return start
            # t falls inside this frame, after its first loud sample: is there one after t?
            if frame.loud_until is not None and frame.loud_until > t:
                return t
        return None

    def last_loud_between(self, t0: float, t1: float) -> float | None:
        """The end of the last loud sample heard in frames that arrived between t0 and t1."""
        ends = [f.loud_until for f in self.heard
                if t0 <= f.at <= t1 and f.loud_until is not None]
        return max(ends) if ends else None

    def silences_between(self, t0: float, t1: float) -> list[float]:
        """Every silence (s) between two loud samples of frames that arrived between t0 and
        t1, in the stream's media time: the gaps the server sent inside a reply (underruns),
        not the silence before or after it, and not network or scheduling jitter."""
        gaps, previous_end = [], None
        for frame in self.heard:
            if frame.at < t0 or frame.at > t1 or frame.first_loud is None:
                continue
            start = frame.media + frame.first_loud
            end = frame.media + (frame.last_loud or 0.0)
            if previous_end is not None and start > previous_end:
                gaps.append(start - previous_end)
            previous_end = end if previous_end is None else max(previous_end, end)
        return gaps

    def lateness_between(self, t0: float, t1: float) -> float:
        """The longest wait (s) between two frames that arrived between t0 and t1 beyond their
        distance in the stream: what a caller's jitter buffer had to bridge."""
        worst, previous = 0.0, None
        for frame in self.heard:
            if frame.at < t0 or frame.at > t1:
                continue
            if previous is not None and frame.media > previous.media:
                worst = max(worst, (frame.at - previous.at) - (frame.media - previous.media))
            previous = frame
        return worst

    def quiet_since(self) -> float | None:
        """When the last loud sample heard ended (None: nothing heard yet)."""
        for frame in reversed(self.heard):
            if frame.loud_until is not None:
                return frame.loud_until
        return None

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio":
            return
        receiver = next(t.receiver for t in self.pc.getTransceivers()
                        if t.receiver.track is track)
        self._time_packets(receiver)
        self._tasks.append(asyncio.ensure_future(self._listen(track)))

    def _time_packets(self, receiver: RTCRtpReceiver) -> None:
        """Note the arrival of every RTP packet, by its media time, before aiortc's jitter
        buffer holds it."""

        def timed(packet: RtpPacket) -> None:
            if self._rtp_origin is None:
                self._rtp_origin = packet.timestamp
            media_time = (packet.timestamp - self._rtp_origin) & 0xFFFFFFFF
            self._rtp_arrivals.setdefault(media_time, time.monotonic())
            while len(self._rtp_arrivals) > _RTP_KEPT:
                self._rtp_arrivals.popitem(last=False)

        watch_rtp_packets(receiver, timed)

    def _arrival(self, frame: av.AudioFrame) -> float:
        """When the packet of this decoded frame arrived (its decoding, if it is unknown)."""
        pts = frame.pts
        arrived = self._rtp_arrivals.pop(pts, None) if pts is not None else None
        if pts is None or arrived is None:
            self.rtp_misses += 1
            return time.monotonic()
        while self._rtp_arrivals and next(iter(self._rtp_arrivals)) < pts:
            self._rtp_arrivals.popitem(last=False)  # packets whose frames will never come
        return arrived

    async def _listen(self, track: MediaStreamTrack) -> None:
        """Drain the agent's track (aiortc buffers it without limit otherwise) and note where
        the sound is in each frame."""
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if not isinstance(frame, av.AudioFrame):
                    raise TypeError(f"the agent's audio track gave a {type(frame).__name__}, "
                                    "not an audio frame")
                self._heard(frame)

    def _heard(self, frame: av.AudioFrame) -> None:
        at = self._arrival(frame)
        samples = frame.to_ndarray().reshape(-1)
        channels = len(frame.layout.channels)
        loud = np.flatnonzero((samples > LOUD) | (samples < -LOUD))
        rate = frame.sample_rate
        first = last = None
        if loud.size:
            first = int(loud[0]) // channels / rate
            last = (int(loud[-1]) // channels + 1) / rate
        media = frame.pts / rate if frame.pts is not None else self._media_end
        self._media_end = media + frame.samples / rate
        self._note_heard(Heard(at, media, frame.samples / rate, first, last))

    def _note_heard(self, heard: Heard) -> None:
        """Keep one received frame; note the reply's first audio; wake waiters on a change
        between sound and silence."""
        self.heard.append(heard)
        loud_from, loud_until = heard.loud_from, heard.loud_until
        if loud_from is not None and loud_until is not None and (
                self.speech_ended_at is not None) and self.first_audio_at is None and (
                loud_until > self.speech_ended_at):
            self.first_audio_at = max(loud_from, self.speech_ended_at)
        if (loud_from is not None) != self._was_loud:
            self._was_loud = loud_from is not None
            self._notify()
