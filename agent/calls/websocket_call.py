"""One Realtime call over a WebSocket (`GET /v1/realtime?model=...`), the way OpenAI's SDKs
connect: server events out as JSON text frames, the agent's audio among them as
`response.output_audio.delta`, the caller's audio in as `input_audio_buffer.append`, both base64
in the audio formats the session chose (pcm16 24 kHz, or G.711 8 kHz: websocket_audio.py). The
conversation is the same session as on a WebRTC call.

Bounded both ways: a client may send audio at most `ws_audio_ahead_ms` ahead of real time, and
the events waiting for it to read are held up to `ws_send_buffer_bytes`; past either it gets an
`error` event and is disconnected.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import numpy as np
from starlette.websockets import WebSocket

from agent.calls.call_base import CallBase
from agent.calls.event_socket import CLOSE_WAIT_S, EventSocket
from agent.calls.limits import TokenBucket
from agent.calls.websocket_audio import (
    PCM,
    WIRE_RATE,
    InputFrames,
    PlayoutClock,
    Resampler,
    WireFormat,
    pcm16,
)
from agent.config import ConversationSettings, Settings
from agent.realtime.server_events import error_event, output_audio_delta, session_created

log = logging.getLogger(__name__)

POLICY_VIOLATION = 1008  # WebSocket close code: the client broke a limit
DELTA_MS = 200  # the agent's audio goes out in deltas of at most this much
# A delta's base64 per ms of audio, in the widest format (pcm16 24 kHz; G.711 takes a third).
DELTA_BYTES_PER_MS = WIRE_RATE * 2 * 4 // 3 // 1000


def audio_lead_ms(settings: Settings) -> int:
    """How far ahead of playback the agent's audio may be sent: outbound_queue_ms, but never
    more than half the send buffer holds. A reply's audio is queued in one go as far as the
    lead allows, so a longer lead would overflow the buffer of a client that reads, and it
    would be taken for one that does not."""
    fits = settings.ws_send_buffer_bytes // 2 // DELTA_BYTES_PER_MS
    return max(DELTA_MS, min(settings.outbound_queue_ms, fits))


class WebSocketCall(CallBase):
    """A caller connected over a WebSocket."""

    id_prefix = "sess"

    def __init__(self, settings: Settings, *args: Any, **kwargs: Any) -> None:
        super().__init__(settings, *args, **kwargs)
        # Its audio travels in its events, in formats the session chooses: audio/pcm until a
        # session.update says otherwise (a WebRTC call has none: its audio is Opus media).
        self.conversation = self.conversation.model_copy(update={
            "input_format": self.conversation.input_format or PCM,
            "output_format": self.conversation.output_format or PCM})
        self.max_message_bytes = settings.ws_max_message_bytes
        self.outbound: PlayoutClock = PlayoutClock(audio_lead_ms(settings))
        self._socket: WebSocket | None = None
        self._events: EventSocket | None = None
        self._ended = asyncio.Event()
        self._refused = False  # over a limit: nothing more is read or queued
        self._frames = InputFrames(self.on_audio_frame)
        self._audio_in = TokenBucket(1000.0, settings.ws_audio_ahead_ms)  # ms of audio
        self._wire_in = WireFormat(PCM)  # the formats last used, as the session chose them
        self._wire_out = WireFormat(PCM)
        self._audio_out = Resampler(WIRE_RATE)
        self._flushes = 0  # the clock's flushes seen by play(): a new one resets the resampler

    async def run(self, socket: WebSocket) -> None:
        """Hold the conversation on an accepted `socket` until either side ends it (its handler
        started before the handshake: start_handler)."""
        self._socket = socket
        self._events = EventSocket(socket, self.settings.ws_send_buffer_bytes)
        self.records.call_started(self.id, self.settings.profile,
                                  getattr(self.handler, "aliases", None))
        self.send_event(session_created(self.session_object()))
        self.spawn(self._events.run())
        self.spawn(self._read_events())
        self.spawn(self.watch_limits())
        await self._ended.wait()

    # -- events and audio to the client ---------------------------------------------------

    def deliver(self, text: str) -> None:
        """Queue a server event for the socket; a client that lets the queue grow past its
        bound is not reading, and is disconnected."""
        if self._refused or self.closed or self._events is None:
            return
        if not self._events.send(text):
            self._events.clear()
            self._refuse("client_not_reading", f"the client left over "
                         f"{self.settings.ws_send_buffer_bytes} bytes of events unread")

    @property
    def events_waiting_bytes(self) -> int:
        """Server events queued for the client, not yet written to its socket."""
        return self._events.waiting_bytes if self._events is not None else 0

    async def play(self, response_id: str, item_id: str, pcm: np.ndarray, rate: int) -> None:
        """A reply's audio goes to the client as `response.output_audio.delta` events, at most
        outbound_queue_ms ahead of what it has played."""
        clock = self.outbound
        generation = self._flush_count()
        wire = self._wire_out = _chosen(self._wire_out, self._session_settings().output_format)
        if self._audio_out.rate != wire.rate:
            self._audio_out = Resampler(wire.rate)
        samples = self._audio_out.convert(pcm16(pcm), rate)
        step = wire.rate * DELTA_MS // 1000
        for begin in range(0, len(samples), step):
            if not await clock.room() or self._flush_count() != generation:
                return  # cut off (barge-in, a cancel): the rest of this chunk is dropped
            piece = samples[begin:begin + step]
            self.send_event(output_audio_delta(response_id, item_id, wire.encode(piece)))
            clock.sent(wire.ms(len(piece)))

    def _flush_count(self) -> int:
        generation = self.outbound.flushes
        if generation != self._flushes:  # flushed: the next audio is not the old one's sequel
            self._flushes = generation
            self._audio_out.reset()
        return generation

    async def wait_events_sent(self, timeout_s: float) -> None:
        if self._events is not None:
            await self._events.drain(timeout_s)

    # -- from the client ------------------------------------------------------------------

    async def _read_events(self) -> None:
        assert self._socket is not None
        while True:
            message = await self._socket.receive()
            if message["type"] == "websocket.disconnect":
                break
            if not self._refused:
                self.on_message(message.get("text") or message.get("bytes") or b"")
        await self.close("hangup")

    def on_message(self, message: str | bytes) -> None:
        """Audio appends are held to real time (plus `ws_audio_ahead_ms`); other events to the
        call's event rate."""
        self._last_activity = time.monotonic()
        event = self.parse(message)
        if event is None:
            return
        if event.type != "input_audio_buffer.append":
            if self._events_bucket.take():
                self.handle(event)
            else:
                self.refuse_excess()
            return
        wire = self._wire_in = _chosen(self._wire_in, self._session_settings().input_format)
        try:
            pcm = wire.decode(event.audio)
        except ValueError as exc:
            self.send_event(error_event(f"input_audio_buffer.append: {exc}", code="invalid_value",
                                        event_id=event.event_id, param="audio"))
            return
        if not self._audio_in.take(wire.ms(len(pcm))):
            self._refuse("input_audio_too_fast", f"the client sent audio over "
                         f"{self.settings.ws_audio_ahead_ms} ms ahead of real time")
            return
        self._frames.push(pcm, wire.rate)

    def _session_settings(self) -> ConversationSettings:
        """The settings the call's session runs with now (a session.update changes them)."""
        settings: ConversationSettings | None = getattr(self.handler, "settings", None)
        return settings if settings is not None else self.conversation

    def _refuse(self, code: str, message: str) -> None:
        """A broken limit: an `error` event saying which, then the socket is closed."""
        if self._refused:
            return
        self._refused = True
        log.info("call %s: disconnected (%s): %s", self.id, code, message)
        if self._events is not None:
            self._events.send_anyway(json.dumps(error_event(message, code=code)))
        self.spawn(self._close_after_error(code))

    async def _close_after_error(self, code: str) -> None:
        await self.wait_events_sent(CLOSE_WAIT_S)
        await self.close(code)

    # -- lifetime -------------------------------------------------------------------------

    async def close_transport(self) -> None:
        if self._events is not None:
            await self._events.close(POLICY_VIOLATION if self._refused else 1000)
        self._ended.set()


def _chosen(current: WireFormat, name: str | None) -> WireFormat:
    """The audio format `name` (audio/pcm by default), `current` itself if it is that one."""
    name = name or PCM
    return current if current.name == name else WireFormat(name)
