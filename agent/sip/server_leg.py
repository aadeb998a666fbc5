"""The server's side of a bridged call: a WebRTC call to omnivox with a G.711-only offer.

The offer names only the codec the phone agreed on (PCMU or PCMA), telephone-event and no data
channel, the shape of any SIP-to-WebRTC bridge's offer: the server answers in G.711, so audio
crosses the bridge as G.711 decoded to 8 kHz PCM and encoded again, never as Opus and never
resampled. The phone's key presses go to the server as RFC 4733 packets on the same audio.
The call's session (instructions, voice, VAD...) goes with the offer as OpenAI's
`multipart/form-data` form; without one the server's profile defaults apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import av
import httpx
from aiortc import MediaStreamTrack, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from agent.sip.phone_track import RATE, PhoneAudioTrack
from media.dtmf import TELEPHONE_EVENT, DtmfSender
from media.peer import dtmf_sender, new_peer_connection

log = logging.getLogger(__name__)

CALLS_PATH = "/v1/realtime/calls"


class ServerRefusedError(RuntimeError):
    """The server did not take the call; `status` is its HTTP status (0: not reached)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ServerLeg:
    """One WebRTC call to the server: the phone's audio goes out on `track`, the agent's audio
    comes back through `on_audio` (8 kHz s16 PCM), and `ended` is set when the call is over."""

    def __init__(self, base_url: str, api_key: str | None, codec: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.codec = codec
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.track = PhoneAudioTrack()
        self.pc = new_peer_connection([])  # host candidates only: the server is reachable
        self.location: str | None = None
        self.on_audio: Callable[[bytes], None] | None = None
        self.ended = asyncio.Event()
        self.end_reason = ""
        self.dtmf: DtmfSender | None = None  # once the server accepted telephone-event
        self._tasks: list[asyncio.Task[None]] = []
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_connection_state)

    async def connect(self, session: dict[str, Any] | None, timeout_s: float) -> None:
        """Offer G.711 in `self.codec` and DTMF (telephone-event at G.711's 8 kHz), post it
        (with `session`, if any), apply the answer. ServerRefusedError when the server refuses
        or cannot be reached."""
        transceiver = self.pc.addTransceiver(self.track, direction="sendrecv")
        capabilities = RTCRtpSender.getCapabilities("audio").codecs
        transceiver.setCodecPreferences(
            [c for c in capabilities if c.name == self.codec]
            + [c for c in capabilities if c.name == TELEPHONE_EVENT and c.clockRate == RATE])
        await self.pc.setLocalDescription(await self.pc.createOffer())
        sdp = self.pc.localDescription.sdp
        try:
            async with httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s,
                                         headers=self._headers) as http:
                if session is None:
                    reply = await http.post(CALLS_PATH, content=sdp,
                                            headers={"Content-Type": "application/sdp"})
                else:
                    # OpenAI's server-side form: the offer and the session as form fields
                    reply = await http.post(CALLS_PATH, files={
                        "sdp": (None, sdp), "session": (None, json.dumps(session))})
        except httpx.HTTPError as exc:
            raise ServerRefusedError(0, f"server not reachable: {exc}") from None
        if reply.status_code != 201:
            raise ServerRefusedError(reply.status_code, _error_message(reply))
        self.location = reply.headers.get("location")
        await self.pc.setRemoteDescription(RTCSessionDescription(reply.text, "answer"))
        self.dtmf = dtmf_sender(self.pc, RATE)

    def press(self, digit: str, duration: int) -> None:
        """A key the phone pressed (`duration` in 8 kHz samples, as RFC 4733 counts it): sent
        on to the server as RFC 4733 on the call's audio, unless the server took no DTMF."""
        if self.dtmf is None:
            log.info("DTMF %s from the phone not relayed: the server took no telephone-event",
                     digit)
            return
        try:
            self.dtmf.press(digit, duration * 1000 // RATE)
        except ValueError as exc:  # an event that is no key (flash, a tone): nothing to relay
            log.info("DTMF from the phone not relayed: %s", exc)

    @property
    def call_id(self) -> str | None:
        return self.location.rsplit("/", 1)[1] if self.location else None

    async def hang_up(self, timeout_s: float = 5.0) -> None:
        """End the server's call (DELETE; a call the server already ended answers 404), then
        close the peer connection; each step bounded."""
        self._end("bridge hung up")
        if self.location:
            with contextlib.suppress(httpx.HTTPError):
                async with httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s,
                                             headers=self._headers) as http:
                    await http.delete(self.location)
        await self.close(timeout_s)

    async def close(self, timeout_s: float = 5.0) -> None:
        self._end("closed")
        self.track.stop()
        if self.dtmf is not None:
            await self.dtmf.close()
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.pc.close(), timeout_s)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._tasks.append(asyncio.ensure_future(self._relay(track)))

    async def _relay(self, track: MediaStreamTrack) -> None:
        """Hand each decoded frame of the agent's audio on (draining the track also keeps
        aiortc's unbounded queue of decoded frames empty)."""
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if self.on_audio is not None and isinstance(frame, av.AudioFrame):
                    self.on_audio(_pcm(frame))
        self._end("the server's audio ended")

    def _on_connection_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self._end(f"connection {self.pc.connectionState}")

    def _end(self, reason: str) -> None:
        if not self.ended.is_set():
            self.end_reason = reason
            self.ended.set()


def _pcm(frame: av.AudioFrame) -> bytes:
    """The frame's samples as s16 mono bytes (aiortc's G.711 decoder already gives 8 kHz s16
    mono; anything else would be a codec we never offered)."""
    if frame.format.name != "s16" or len(frame.layout.channels) != 1 or frame.sample_rate != 8000:
        raise ValueError(f"unexpected audio from the server: {frame.format.name} "
                         f"{frame.layout.name} {frame.sample_rate} Hz")
    return bytes(frame.planes[0])[: frame.samples * 2]


def _error_message(reply: httpx.Response) -> str:
    try:
        return str(reply.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return reply.text[:200] or reply.reason_phrase
