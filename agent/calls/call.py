"""One WebRTC call: its peer connection, the caller's audio track through the VAD, the agent's
outbound track and the `oai-events` data channel (what every call has is in call_base.py). What
to *do* with the caller's speech is the business of the call's handler (the conversation
session, or a test's responder)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from aiortc import MediaStreamTrack, RTCDataChannel
from aiortc.mediastreams import MediaStreamError

from agent.calls.call_base import CallBase, CallHandler
from agent.config import Settings
from agent.realtime.server_events import dtmf_event_received, session_created
from agent.realtime.session_config import SavedConversation, configure
from agent.realtime.transport import AudioOutEnded
from media.aiortc_internals import data_channel_backlog
from media.encoded_audio import EncodedAudioTrack
from media.inbound import InboundAudio
from media.outbound import OutboundAudioTrack
from media.peer import (
    apply_offer,
    create_answer,
    hold_inbound_audio,
    new_peer_connection,
    sent_codec,
    watch_dtmf,
)

log = logging.getLogger(__name__)

EVENTS_CHANNEL = "oai-events"
PENDING_EVENTS_MAX = 256  # server events kept until the data channel opens
CONNECT_TIMEOUT_S = 30.0  # a call whose ICE/DTLS never completes is torn down

__all__ = ["Call", "CallHandler", "HandlerFactory"]

HandlerFactory = Callable[[Any], CallHandler]


class Call(CallBase):
    """A caller connected over WebRTC."""

    id_prefix = "rtc"

    def __init__(self, settings: Settings, *args: Any, **kwargs: Any) -> None:
        super().__init__(settings, *args, **kwargs)
        self.pc = new_peer_connection(settings.ice_servers)
        self.outbound: OutboundAudioTrack = OutboundAudioTrack(
            max_queue_ms=settings.outbound_queue_ms
        )
        self.inbound: InboundAudio | None = None  # the caller's audio, once its track arrives
        self._channel: RTCDataChannel | None = None
        self._pending: deque[str] = deque(maxlen=PENDING_EVENTS_MAX)
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_connection_state)

    async def answer(self, offer_sdp: str, handler_factory: HandlerFactory | None,
                     session: Any = None, resumed: SavedConversation | None = None) -> str:
        """Negotiate the call, going on with a dropped call's conversation (`resumed`), then
        the session object given with the offer (if any), its handler made before negotiation;
        on any failure the call is closed before raising."""
        try:
            if resumed is not None:
                self.start = resumed.config
            if session is not None:  # SessionConfigError: refused before any negotiation
                self.start = configure(session, self.start, self.settings.vad)
            self.start_handler(handler_factory)  # UnknownVoiceError: refused before negotiation
            resume = getattr(self.handler, "resume", None)
            if resumed is not None and resume is not None:
                resume(resumed.history)
            await apply_offer(self.pc, offer_sdp)
            hold_inbound_audio(self.pc, self.settings.inbound_jitter_packets)
            watch_dtmf(self.pc, self._on_dtmf)
            # The codec is asked for at the first frame, after negotiation: by then `sender`,
            # bound on the next line, is the sender of this very track.
            encoded = EncodedAudioTrack(self.outbound, lambda: sent_codec(self.pc, sender))
            sender = self.pc.addTrack(encoded)
            answer = await create_answer(self.pc)
        except BaseException:
            await self.close()
            raise
        self.spawn(self._connect_watchdog())
        self.records.call_started(self.id, self.settings.profile,
                                  getattr(self.handler, "aliases", None))
        self.spawn(self.watch_limits())
        return answer

    # -- events and audio to the caller ---------------------------------------------------

    def deliver(self, text: str) -> None:
        """Send a server event, or keep it (bounded) until the data channel is open."""
        channel = self._channel
        if channel is None or channel.readyState != "open":
            self._pending.append(text)
            return
        channel.send(text)

    async def play(self, response_id: str, item_id: str, pcm: np.ndarray, rate: int) -> None:
        """A reply's audio goes out on the outbound track, paced (the ids travel on no
        event: the caller hears the audio)."""
        try:
            await self.outbound.write(pcm, rate)
        except MediaStreamError as exc:
            # aiortc stops the track when the peer connection's transport closes, which can
            # come before the connection's state change reaches the call.
            raise AudioOutEnded from exc

    # -- peer connection callbacks --------------------------------------------------------

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio":
            return
        self.inbound = InboundAudio(track, self.on_audio_frame)
        self.spawn(self.inbound.run())

    def _on_dtmf(self, digit: str) -> None:
        """A key the caller pressed (RFC 4733): an event to the caller and its observers."""
        log.info("call %s: DTMF %s", self.id, digit)
        self._last_activity = time.monotonic()
        self.send_event(dtmf_event_received(digit, int(time.time())))

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_CHANNEL or self._channel is not None:
            return
        self._channel = channel
        channel.on("message", self.on_message)
        if channel.readyState == "open":
            self._flush_pending()
        else:
            channel.on("open", self._flush_pending)

    def _flush_pending(self) -> None:
        resume = None
        if self.resume_token is not None:
            resume = {"token": self.resume_token, "grace_s": self.settings.resume_grace_s}
        self.send_event(session_created(self.session_object(), resume))
        while self._pending:
            self.deliver(self._pending.popleft())

    def _on_connection_state(self) -> None:
        # Read the state as it is emitted: a failed ICE transport closes DTLS, which makes
        # aiortc close the peer connection, so by the time a task ran it would say "closed".
        state = self.pc.connectionState
        if state in ("failed", "closed"):
            self.spawn(self.close(f"connection_{state}"))

    async def _connect_watchdog(self) -> None:
        await asyncio.sleep(CONNECT_TIMEOUT_S)
        if self.pc.connectionState != "connected":
            log.warning("call %s: not connected after %.0f s, closing", self.id, CONNECT_TIMEOUT_S)
            await self.close("connect_timeout")

    # -- lifetime -------------------------------------------------------------------------

    async def wait_events_sent(self, timeout_s: float) -> None:
        """Wait (bounded) until the data channel holds no event the caller has not acked."""
        channel = self._channel
        if channel is None or channel.readyState != "open":
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and data_channel_backlog(channel):
            await asyncio.sleep(0.02)

    async def close_transport(self) -> None:
        self.outbound.stop()
        await self.pc.close()

