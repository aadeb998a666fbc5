"""What every call has, whatever carries it (WebRTC in call.py, a WebSocket in
websocket_call.py): its id and settings, the caller's audio through the VAD (or, with server VAD
off, into a bounded buffer the client commits), client events handed to the call's handler under
a rate limit, the call's duration and idle limits, and its end."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from agent.calls.limits import TokenBucket
from agent.config import ConversationSettings, Settings
from agent.ops import logs
from agent.ops.metrics import Metrics
from agent.ops.records import CallRecords
from agent.realtime.events import ClientEventError, parse_client_event
from agent.realtime.server_events import (
    error_event,
    new_id,
    session_object,
    speech_started,
    speech_stopped,
)
from agent.realtime.session_config import SessionConfig
from agent.realtime.transport import AudioOut
from agent.realtime.voices import check_voice
from media.audio_format import FRAME_MS
from media.noise_reduction import NoiseSuppressor
from media.rnnoise_internals import RnnoiseInternalsError
from media.vad import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped, VadSegmenter

log = logging.getLogger(__name__)

FINAL_EVENT_WAIT_S = 2.0  # how long a call ended by the server waits for its last event to land
# `rate_limit_exceeded` errors are themselves rate-limited, so a flood cannot make the server
# queue one outgoing event per dropped message: a few at once, then one a second.
REFUSALS_PER_S = 1.0
REFUSALS_BURST = 5


class CallHandler(Protocol):
    """What a call hands the caller's speech and client events to."""

    def on_speech_started(self, event: SpeechStarted, item_id: str) -> None: ...

    def on_speech_heard(self, voiced_ms: int) -> None:
        """A frame of the speech in progress, `voiced_ms` long so far (its onset included)."""

    def on_speech_stopped(self, event: SpeechStopped, item_id: str) -> None: ...

    def on_speech_paused(self, event: SpeechPaused) -> None: ...

    def on_speech_resumed(self, event: SpeechResumed) -> None: ...

    def on_client_event(self, event: Any) -> None: ...

    async def aclose(self) -> None: ...


class Observer(Protocol):
    """A sideband socket on the call (agent/calls/sideband.py): sees every server event."""

    def send(self, text: str) -> bool: ...

    async def close(self, code: int) -> None: ...


class CallBase:
    """A caller connected by some transport; subclasses carry its audio and events."""

    outbound: AudioOut
    id_prefix = "call"

    def __init__(
        self,
        settings: Settings,
        on_ended: Callable[[Any], None],
        records: CallRecords | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.id = new_id(self.id_prefix)
        self.settings = settings
        self.max_message_bytes = settings.max_event_bytes
        # What the call's session starts with: the server's, the offer's session, or a resumed
        # call's (call.py). The session owns it from then on and tells the call (run_with).
        self.start = SessionConfig(settings.conversation, settings.vad)
        self.vad = VadSegmenter(self.start.vad)
        self.server_vad = self.start.conversation.server_vad  # off: the client commits turns
        self.handler: CallHandler | None = None
        self.observers: set[Observer] = set()
        self._input: deque[np.ndarray] = deque()  # 20 ms frames since the last commit (no VAD)
        self._denoiser: NoiseSuppressor | None = None  # while the session asks (noise_reduction)
        self._no_denoiser = False  # one could not be made: said once, the audio goes on as is
        self._tasks: set[asyncio.Task[None]] = set()
        self._speech_item: str | None = None
        self._on_ended = on_ended
        self._closed = False
        self.end_reason: str | None = None  # why the call ended, once it has
        self.resume_token: str | None = None  # what its caller may resume it with (resume.py)
        self.metrics = metrics if metrics is not None else Metrics()
        self.records = records or CallRecords(None)  # where the call and its turns are kept
        self.started_at = time.monotonic()
        self._last_activity = self.started_at
        self._events_bucket = TokenBucket(settings.max_events_per_s, settings.max_event_burst)
        self._refusals = TokenBucket(REFUSALS_PER_S, REFUSALS_BURST)
        self._dropped = 0  # messages dropped since the last rate_limit_exceeded error

    @property
    def conversation(self) -> ConversationSettings:
        """The conversation's settings the call's session starts with."""
        return self.start.conversation

    @conversation.setter
    def conversation(self, settings: ConversationSettings) -> None:
        self.start = dataclasses.replace(self.start, conversation=settings)

    def run_with(self, config: SessionConfig) -> None:
        """Take the caller's audio as `config` says from the next frame: through the VAD with
        its settings, or into the buffer the client commits (turn_detection null). Told at the
        start and by the call's session, which owns the configuration, at each change."""
        self.server_vad = config.conversation.server_vad
        self.vad.reconfigure(config.vad)

    # -- events to the caller -------------------------------------------------------------

    def send_event(self, event: dict[str, Any]) -> None:
        """Send a server event to the caller, and a copy to every observer of the call."""
        text = json.dumps(event, separators=(",", ":"))
        for observer in list(self.observers):
            if not observer.send(text):  # an observer that does not read is let go
                self.observers.discard(observer)
                log.info("call %s: a sideband observer stopped reading; closed", self.id)
                self.spawn(observer.close(1008))
        self.deliver(text)

    def deliver(self, text: str) -> None:
        """Send one server event, as JSON text, over the call's own transport."""
        raise NotImplementedError

    def start_handler(self, factory: Callable[[Any], CallHandler] | None) -> None:
        """Hand the call to the handler `factory` makes (the session on the model version the
        call pins); UnknownVoiceError when that model does not speak the voice the call starts
        with, the offer's or the server's (the caller closes the call: the handler lets go of
        its version there). The caller's audio is taken as the configuration the call starts
        with says until the session changes it."""
        self.run_with(self.start)
        self.handler = factory(self) if factory else None
        # The handler's voice: an OpenAI voice name is resolved there (realtime/aliases.py).
        voice = getattr(getattr(self.handler, "settings", None), "voice", self.conversation.voice)
        check_voice(voice, getattr(self.handler, "pipeline", None))

    def session_object(self) -> dict[str, Any]:
        """The session as `session.created` describes it (the handler's view when it has one)."""
        describe = getattr(self.handler, "session_object", None)
        if describe is not None:
            return describe()  # type: ignore[no-any-return]
        return session_object(
            self.id, self.settings.profile, self.conversation, self.start.vad,
            self.start.tools.tools_field(), self.start.tools.choice_field(),
        )

    # -- caller audio ---------------------------------------------------------------------

    def on_audio_frame(self, frame: np.ndarray) -> None:
        """One 20 ms frame of the caller's 16 kHz audio, denoised if the session asks: to the
        VAD, or into the input buffer the client commits when server VAD is off (the newest
        max_utterance_ms kept)."""
        frame = self._denoised(frame)
        if not self.server_vad:
            self._input.append(frame.copy())
            while len(self._input) * FRAME_MS > self.vad.config.max_utterance_ms:
                self._input.popleft()
            return
        events = self.vad.push(frame)
        if events or self.vad.in_speech or self.outbound.playing:
            self._last_activity = time.monotonic()
        for event in events:
            if isinstance(event, SpeechPaused | SpeechResumed):
                if self.handler:  # no client event: OpenAI's protocol has none
                    self._pause_or_resume(event)
            elif isinstance(event, SpeechStarted):
                self._speech_item = new_id("item")
                self.send_event(speech_started(self._speech_item, event.audio_start_ms))
                if self.handler:
                    self.handler.on_speech_started(event, self._speech_item)
            else:
                self._speech_stopped(event)
        if self.handler and self.vad.in_speech:
            self.handler.on_speech_heard(self.vad.voiced_ms)

    def _denoised(self, frame: np.ndarray) -> np.ndarray:
        """`frame` through the call's noise suppressor while its session asks for one
        (`audio.input.noise_reduction`): made when turned on, dropped when turned off, so each
        time on starts afresh."""
        settings = getattr(self.handler, "settings", None)
        if not isinstance(settings, ConversationSettings):
            settings = self.conversation
        if settings.noise_reduction is None:
            if self._denoiser is not None:
                self._denoiser.close()
                self._denoiser = None
            return frame
        if self._denoiser is None:
            if self._no_denoiser:
                return frame
            try:
                self._denoiser = NoiseSuppressor()
            except RnnoiseInternalsError:  # configure() checked the library: not seen in practice
                log.exception("call %s: no noise suppressor; the audio goes on as it is", self.id)
                self._no_denoiser = True
                return frame
        return self._denoiser.process(frame)

    def end_utterance(self) -> bool:
        """End the caller's utterance at the pause it is in, as the end-of-turn silence would
        (agent/realtime/turn_taking/semantic_turns.py); False when the caller is not in a
        pause."""
        event = self.vad.end_now()
        if event is None:
            return False
        self._speech_stopped(event)
        return True

    def _speech_stopped(self, event: SpeechStopped) -> None:
        if event.capped:
            log.info("call %s: utterance cut at the %d ms cap", self.id,
                     self.vad.config.max_utterance_ms)
        item_id = self._speech_item or new_id("item")
        self._speech_item = None
        self.send_event(speech_stopped(item_id, event.audio_end_ms))
        if self.handler:
            self.handler.on_speech_stopped(event, item_id)

    def _pause_or_resume(self, event: SpeechPaused | SpeechResumed) -> None:
        assert self.handler is not None
        if isinstance(event, SpeechPaused):
            self.handler.on_speech_paused(event)
        else:
            self.handler.on_speech_resumed(event)

    def take_input(self) -> np.ndarray | None:
        """The caller's audio since the last commit or clear (server VAD off), then none."""
        if not self._input:
            return None
        pcm: np.ndarray = np.concatenate(list(self._input))
        self._input.clear()
        self._last_activity = time.monotonic()
        return pcm

    def clear_input(self) -> None:
        self._input.clear()
        self.vad.clear()

    # -- client events --------------------------------------------------------------------

    def on_message(self, message: str | bytes) -> None:
        """A client message: counted against the call's rate, parsed, then handled."""
        self._last_activity = time.monotonic()
        if not self._events_bucket.take():
            self.refuse_excess()
            return
        event = self.parse(message)
        if event is not None:
            self.handle(event)

    def parse(self, message: str | bytes) -> Any:
        """The client event in `message`, or None once the caller was told what is wrong."""
        try:
            return parse_client_event(message, self.max_message_bytes)
        except ClientEventError as exc:
            self.send_event(exc.to_event())
        except Exception:  # a parser bug: this message is lost, never the call
            log.exception("call %s: a client message could not be parsed", self.id)
            self.send_event(error_event("the event could not be read", code="server_error",
                                        error_type="server_error"))
        return None

    def handle(self, event: Any) -> None:
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

    def refuse_excess(self) -> None:
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

    async def watch_limits(self) -> None:
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
        await self.wait_events_sent(FINAL_EVENT_WAIT_S)
        await self.close(code)

    async def wait_events_sent(self, timeout_s: float) -> None:
        """Wait (bounded) until the events sent so far have left."""

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
        """Hang up: stop the call's tasks and its handler, then its transport; `reason` goes
        into the call's record."""
        if self._closed:
            return
        self._closed = True
        self.end_reason = reason
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
        for observer in list(self.observers):
            await observer.close(1000)
        await self.close_transport()
        log.info("call %s ended (%s) after %.1f s", self.id, reason,
                 time.monotonic() - self.started_at)

    async def close_transport(self) -> None:
        """Release what carries the call (its peer connection, its socket)."""
