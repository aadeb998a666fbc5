"""One WebRTC call: its peer connection, the caller's audio through the VAD, the agent's
outbound track and the `oai-events` data channel. What to *do* with the caller's speech is the
business of the call's handler (the conversation session, or a test's responder)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection

from agent.calls.limits import TokenBucket
from agent.config import Settings
from agent.ops import logs
from agent.ops.metrics import Metrics
from agent.ops.records import CallRecords
from agent.realtime.events import ClientEventError, parse_client_event
from agent.realtime.server_events import (
    error_event,
    new_id,
    session_created,
    session_object,
    speech_started,
    speech_stopped,
)
from agent.realtime.session_config import SessionConfig, configure
from media.encoded_audio import EncodedAudioTrack
from media.inbound import InboundAudio
from media.outbound import OutboundAudioTrack
from media.peer import (
    apply_offer,
    create_answer,
    hold_inbound_audio,
    new_peer_connection,
    sent_codec,
)
from media.vad import SpeechStarted, SpeechStopped, VadSegmenter

log = logging.getLogger(__name__)

EVENTS_CHANNEL = "oai-events"
PENDING_EVENTS_MAX = 256  # server events kept until the data channel opens
CONNECT_TIMEOUT_S = 30.0  # a call whose ICE/DTLS never completes is torn down
FINAL_EVENT_WAIT_S = 2.0  # how long a call ended by the server waits for its last event to land
# `rate_limit_exceeded` errors are themselves rate-limited, so a flood cannot make the server
# queue one outgoing event per dropped message: a few at once, then one a second.
REFUSALS_PER_S = 1.0
REFUSALS_BURST = 5


class CallHandler(Protocol):
    """What a call hands the caller's speech and client events to."""

    def on_speech_started(self, event: SpeechStarted, item_id: str) -> None: ...

    def on_speech_stopped(self, event: SpeechStopped, item_id: str) -> None: ...

    def on_client_event(self, event: Any) -> None: ...

    async def aclose(self) -> None: ...


HandlerFactory = Callable[["Call"], CallHandler]


class Call:
    """A caller connected over WebRTC."""

    def __init__(
        self,
        settings: Settings,
        on_ended: Callable[[Call], None],
        records: CallRecords | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.id = new_id("rtc")
        self.settings = settings
        # The conversation's settings at the start: the server's, or the offer's session.
        self.conversation = settings.conversation
        self.pc: RTCPeerConnection = new_peer_connection(settings.ice_servers)
        self.outbound = OutboundAudioTrack(max_queue_ms=settings.outbound_queue_ms)
        self.inbound: InboundAudio | None = None  # the caller's audio, once its track arrives
        self.vad = VadSegmenter(settings.vad)
        self.handler: CallHandler | None = None
        self._channel: RTCDataChannel | None = None
        self._pending: deque[dict[str, Any]] = deque(maxlen=PENDING_EVENTS_MAX)
        self._tasks: set[asyncio.Task[None]] = set()
        self._speech_item: str | None = None
        self._on_ended = on_ended
        self._closed = False
        self.metrics = metrics if metrics is not None else Metrics()
        self.records = records or CallRecords(None)  # where the call and its turns are kept
        self.started_at = time.monotonic()
        self._last_activity = self.started_at
        self._events_bucket = TokenBucket(settings.max_events_per_s, settings.max_event_burst)
        self._refusals = TokenBucket(REFUSALS_PER_S, REFUSALS_BURST)
        self._dropped = 0  # messages dropped since the last rate_limit_exceeded error
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_connection_state)

    async def answer(self, offer_sdp: str, handler_factory: HandlerFactory | None,
                     session: Any = None) -> str:
        """Negotiate the call, starting with the session object given with the offer (if any);
        on any failure the peer connection is closed before raising."""
        try:
            if session is not None:  # SessionConfigError: refused before any negotiation
                start = configure(session, SessionConfig(self.conversation, self.vad.config))
                self.conversation = start.conversation
                self.vad.reconfigure(start.vad)
            await apply_offer(self.pc, offer_sdp)
            hold_inbound_audio(self.pc, self.settings.inbound_jitter_packets)
            # The codec is asked for at the first frame, after negotiation: by then `sender`,
            # bound on the next line, is the sender of this very track.
            encoded = EncodedAudioTrack(self.outbound, lambda: sent_codec(self.pc, sender))
            sender = self.pc.addTrack(encoded)
            answer = await create_answer(self.pc)
        except BaseException:
            await self.close()
            raise
        self.handler = handler_factory(self) if handler_factory else None
        self.spawn(self._connect_watchdog())
        self.records.call_started(self.id, self.settings.profile)
        self.spawn(self._watch_limits())
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
        return session_object(
            self.id, self.settings.profile, self.conversation, self.vad.config
        )

    # -- peer connection callbacks --------------------------------------------------------

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio":
            return
        self.inbound = InboundAudio(track, self._on_audio_frame)
        self.spawn(self.inbound.run())

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
        self.send_event(session_created(self.session_object()))
        while self._pending:
            self.send_event(self._pending.popleft())

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

    # -- caller audio and messages --------------------------------------------------------

    def _on_audio_frame(self, frame: np.ndarray) -> None:
        events = self.vad.push(frame)
        if events or self.vad.in_speech or self.outbound.playing:
            self._last_activity = time.monotonic()
        for event in events:
            if isinstance(event, SpeechStarted):
                self._speech_item = new_id("item")
                self.send_event(speech_started(self._speech_item, event.audio_start_ms))
                if self.handler:
                    self.handler.on_speech_started(event, self._speech_item)
            else:
                if event.capped:
                    log.info("call %s: utterance cut at the %d ms cap", self.id,
                             self.vad.config.max_utterance_ms)
                item_id = self._speech_item or new_id("item")
                self._speech_item = None
                self.send_event(speech_stopped(item_id, event.audio_end_ms))
                if self.handler:
                    self.handler.on_speech_stopped(event, item_id)

    def _on_message(self, message: str | bytes) -> None:
        self._last_activity = time.monotonic()
        if not self._events_bucket.take():
            self._refuse_excess()
            return
        try:
            event = parse_client_event(message, self.settings.max_event_bytes)
        except ClientEventError as exc:
            self.send_event(exc.to_event())
            return
        except Exception:  # a parser bug: this message is lost, never the call
            log.exception("call %s: a client message could not be parsed", self.id)
            self.send_event(error_event("the event could not be read", code="server_error",
                                        error_type="server_error"))
            return
        if self.handler is None:
            return
        try:
            self.handler.on_client_event(event)
        except Exception:  # a handler bug must cost the caller this event, not the call
            log.exception("call %s: handling %s failed", self.id, event.type)
            self.send_event(
                error_event(
                    f"{event.type} could not be handled",
                    code="server_error",
                    error_type="server_error",
                    event_id=getattr(event, "event_id", None),
                )
            )

    def _refuse_excess(self) -> None:
        """Drop a message over the call's rate, unread; say so while the refusals' own budget
        lasts (the count of silently dropped ones goes into the next error)."""
        self._dropped += 1
        if not self._refusals.take():
            return
        rate, burst = self.settings.max_events_per_s, self.settings.max_event_burst
        log.info("call %s: over %g events/s, %d dropped", self.id, rate, self._dropped)
        self.send_event(
            error_event(
                f"too many client events: at most {rate:g}/s (bursts of {burst}); "
                f"{self._dropped} dropped unread",
                code="rate_limit_exceeded",
            )
        )
        self._dropped = 0

    # -- limits ---------------------------------------------------------------------------

    async def _watch_limits(self) -> None:
        """End the call at its maximum duration, or once nothing has happened on it (no caller
        speech, no message, no agent audio) for the idle timeout."""
        max_call_s, idle_s = self.settings.max_call_s, self.settings.idle_timeout_s
        ends_at = self.started_at + max_call_s
        while not self._closed:
            now = time.monotonic()
            if self.outbound.playing or self.outbound.queued_ms > 0:
                self._last_activity = now  # the caller is listening to the agent
            if now >= ends_at:
                await self.end("call_duration_exceeded",
                               f"the call reached its maximum duration of {max_call_s:g} s")
                return
            if now >= self._last_activity + idle_s:
                await self.end("idle_timeout",
                               f"nothing was said or sent on the call for {idle_s:g} s")
                return
            await asyncio.sleep(min(ends_at, self._last_activity + idle_s) - now)

    async def end(self, code: str, message: str) -> None:
        """Hang up from the server's side: a final `error` event saying why, a short wait for
        it to reach the caller, then close."""
        if self._closed:
            return
        log.info("call %s: ending (%s): %s", self.id, code, message)
        self.send_event(error_event(message, code=code))
        await self._wait_events_sent(FINAL_EVENT_WAIT_S)
        await self.close(code)

    async def _wait_events_sent(self, timeout_s: float) -> None:
        """Wait (bounded) until the data channel holds no event the caller has not acked."""
        channel = self._channel
        if channel is None or channel.readyState != "open":
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _unsent(channel):
            await asyncio.sleep(0.02)

    # -- lifetime -------------------------------------------------------------------------

    def spawn(self, coro: Any) -> None:
        """Run `coro` as a task that ends with the call."""
        with logs.context(call_id=self.id):  # whoever starts it, it logs as the call's
            task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self, reason: str = "hangup") -> None:
        """Hang up: stop the media tasks and the handler, close the peer connection; `reason`
        goes into the call's record."""
        if self._closed:
            return
        self._closed = True
        logs.bind_call(self.id)  # a hang-up request, say, logs the rest as the call's
        self.metrics.call_ended(reason)
        self._on_ended(self)
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        if self.handler:
            with contextlib.suppress(Exception):
                await self.handler.aclose()
        self.records.call_ended(self.id, reason)
        self.outbound.stop()
        await self.pc.close()
        log.info("call %s ended (%s) after %.1f s", self.id, reason,
                 time.monotonic() - self.started_at)


def _unsent(channel: RTCDataChannel) -> bool:
    """Whether `channel` still has data queued or in flight. aiortc has no public "all acked",
    so this looks at its SCTP queues when they are there, and at bufferedAmount otherwise."""
    sctp = channel.transport
    return bool(
        channel.bufferedAmount
        or getattr(sctp, "_data_channel_queue", None)
        or getattr(sctp, "_outbound_queue", None)
        or getattr(sctp, "_sent_queue", None)
    )
