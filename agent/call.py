"""One WebRTC call: its peer connection, the caller's audio through the VAD, the agent's
outbound track and the `oai-events` data channel. What to *do* with the caller's speech is the
business of the call's handler (the conversation session, or a test's responder)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection

from agent.config import Settings
from agent.events import ClientEventError, new_id, parse_client_event, server_event
from agent.payloads import session_object
from media.inbound import InboundAudio
from media.outbound import OutboundAudioTrack
from media.peer import apply_offer, create_answer, new_peer_connection
from media.vad import SpeechStarted, SpeechStopped, VadConfig, VadSegmenter

log = logging.getLogger(__name__)

EVENTS_CHANNEL = "oai-events"
PENDING_EVENTS_MAX = 256  # server events kept until the data channel opens
CONNECT_TIMEOUT_S = 30.0  # a call whose ICE/DTLS never completes is torn down


class CallHandler(Protocol):
    """What a call hands the caller's speech and client events to."""

    def on_speech_started(self, event: SpeechStarted, item_id: str) -> None: ...

    def on_speech_stopped(self, event: SpeechStopped, item_id: str) -> None: ...

    def on_client_event(self, event: Any) -> None: ...

    async def aclose(self) -> None: ...


HandlerFactory = Callable[["Call"], CallHandler]


def vad_config(settings: Settings) -> VadConfig:
    v = settings.vad
    return VadConfig(
        aggressiveness=v.aggressiveness,
        onset_ms=v.onset_ms,
        silence_ms=v.silence_ms,
        preroll_ms=v.preroll_ms,
        max_utterance_ms=v.max_utterance_ms,
    )


class Call:
    """A caller connected over WebRTC."""

    def __init__(self, settings: Settings, on_ended: Callable[[Call], None]) -> None:
        self.id = new_id("rtc")
        self.settings = settings
        self.pc: RTCPeerConnection = new_peer_connection(settings.ice_servers)
        self.outbound = OutboundAudioTrack(max_queue_ms=settings.outbound_queue_ms)
        self.vad = VadSegmenter(vad_config(settings))
        self.handler: CallHandler | None = None
        self._channel: RTCDataChannel | None = None
        self._pending: deque[dict[str, Any]] = deque(maxlen=PENDING_EVENTS_MAX)
        self._tasks: set[asyncio.Task[None]] = set()
        self._speech_item: str | None = None
        self._on_ended = on_ended
        self._closed = False
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_connection_state)

    async def answer(self, offer_sdp: str, handler_factory: HandlerFactory | None) -> str:
        """Negotiate the call; on any failure the peer connection is closed before raising."""
        try:
            await apply_offer(self.pc, offer_sdp)
            self.pc.addTrack(self.outbound)
            answer = await create_answer(self.pc)
        except BaseException:
            await self.close()
            raise
        self.handler = handler_factory(self) if handler_factory else None
        self.spawn(self._connect_watchdog())
        return answer

    # -- events to the caller -------------------------------------------------------------

    def send_event(self, event: dict[str, Any]) -> None:
        """Send a server event, or keep it (bounded) until the data channel is open."""
        channel = self._channel
        if channel is None or channel.readyState != "open":
            self._pending.append(event)
            return
        channel.send(json.dumps(event, separators=(",", ":")))

    def session_object(self) -> dict[str, Any]:
        """The session as `session.created` describes it (the handler's view when it has one)."""
        describe = getattr(self.handler, "session_object", None)
        if describe is not None:
            return describe()
        conversation = self.settings.conversation
        return session_object(
            self.id,
            self.settings.profile,
            conversation.instructions,
            conversation.voice,
            self.vad.config,
            interrupt=conversation.barge_in,
            create_response=conversation.create_response,
        )

    # -- peer connection callbacks --------------------------------------------------------

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio":
            return
        self.spawn(InboundAudio(track, self._on_audio_frame).run())

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_CHANNEL or self._channel is not None:
            return
        self._channel = channel
        channel.on("message", self._on_message)
        if channel.readyState == "open":
            self._flush_pending()
        else:
            channel.on("open", self._flush_pending)

    def _flush_pending(self) -> None:
        self.send_event(server_event("session.created", session=self.session_object()))
        while self._pending:
            self.send_event(self._pending.popleft())

    async def _on_connection_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            await self.close()

    async def _connect_watchdog(self) -> None:
        await asyncio.sleep(CONNECT_TIMEOUT_S)
        if self.pc.connectionState != "connected":
            log.warning("call %s: not connected after %.0f s, closing", self.id, CONNECT_TIMEOUT_S)
            await self.close()

    # -- caller audio and messages --------------------------------------------------------

    def _on_audio_frame(self, frame: np.ndarray) -> None:
        for event in self.vad.push(frame):
            if isinstance(event, SpeechStarted):
                self._speech_item = new_id("item")
                self.send_event(
                    server_event(
                        "input_audio_buffer.speech_started",
                        audio_start_ms=event.audio_start_ms,
                        item_id=self._speech_item,
                    )
                )
                if self.handler:
                    self.handler.on_speech_started(event, self._speech_item)
            else:
                item_id = self._speech_item or new_id("item")
                self._speech_item = None
                self.send_event(
                    server_event(
                        "input_audio_buffer.speech_stopped",
                        audio_end_ms=event.audio_end_ms,
                        item_id=item_id,
                    )
                )
                if self.handler:
                    self.handler.on_speech_stopped(event, item_id)

    def _on_message(self, message: str | bytes) -> None:
        try:
            event = parse_client_event(message, self.settings.max_event_bytes)
        except ClientEventError as exc:
            self.send_event(exc.to_event())
            return
        if self.handler:
            self.handler.on_client_event(event)

    # -- lifetime -------------------------------------------------------------------------

    def spawn(self, coro: Any) -> None:
        """Run `coro` as a task that ends with the call."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Hang up: stop the media tasks and the handler, close the peer connection."""
        if self._closed:
            return
        self._closed = True
        self._on_ended(self)
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        if self.handler:
            with contextlib.suppress(Exception):
                await self.handler.aclose()
        self.outbound.stop()
        await self.pc.close()
        log.info("call %s ended", self.id)
