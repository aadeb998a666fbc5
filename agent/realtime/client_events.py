"""What each Realtime client event does to a session: a table from event type to handler."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent.realtime.server_events import (
    conversation_item_created,
    conversation_item_truncated,
    error_event,
    input_audio_buffer_cleared,
    new_id,
    session_updated,
    user_text_item,
)
from media.vad import VadConfig

if TYPE_CHECKING:
    from agent.realtime.session import Session

log = logging.getLogger(__name__)

MAX_REPLY_TOKENS = 4096  # what "inf" means here: the Thinker's context bounds it anyway
# OpenAI's VAD threshold (0..1) onto webrtcvad's aggressiveness (0..3).
_THRESHOLDS = ((0.35, 0), (0.55, 1), (0.75, 2))


def aggressiveness(threshold: float) -> int:
    return next((mode for limit, mode in _THRESHOLDS if threshold < limit), 3)


class ClientEvents:
    """The session's half that listens: one handler per client event type, in one table."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.handlers: dict[str, Callable[[Any], None]] = {
            "session.update": self.session_update,
            "response.create": self.response_create,
            "response.cancel": self.response_cancel,
            "output_audio_buffer.clear": self.output_audio_buffer_clear,
            "input_audio_buffer.clear": self.input_audio_buffer_clear,
            "conversation.item.create": self.conversation_item_create,
            "conversation.item.truncate": self.conversation_item_truncate,
        }

    def dispatch(self, event: Any) -> None:
        """Run `event`'s handler; an event type with none gets an `error` event."""
        handler = self.handlers.get(event.type)
        if handler is None:
            self.session.call.send_event(
                error_event(
                    f"{event.type} is not supported on a WebRTC call",
                    code="unsupported_event",
                    event_id=event.event_id,
                )
            )
            return
        handler(event)

    def session_update(self, event: Any) -> None:
        """Apply every change or none: a bad value is an `error` and the session stays as is."""
        update, live = event.session, self.session
        audio = getattr(update, "audio", None)
        detection = getattr(getattr(audio, "input", None), "turn_detection", None)
        max_tokens = getattr(update, "max_output_tokens", None)
        try:
            vad = self._vad_config(detection) if detection is not None else None
            if max_tokens not in (None, "inf") and not 1 <= max_tokens <= MAX_REPLY_TOKENS:
                raise ValueError(f"max_output_tokens must be 1..{MAX_REPLY_TOKENS} or 'inf'")
        except ValueError as exc:
            live.call.send_event(
                error_event(f"session.update: {exc}", code="invalid_value",
                            event_id=event.event_id)
            )
            return
        if max_tokens is not None:
            live.settings.max_reply_tokens = MAX_REPLY_TOKENS if max_tokens == "inf" else max_tokens
        if getattr(update, "instructions", None) is not None:
            live.settings.instructions = update.instructions
            live.conversation.instructions = update.instructions
        output = getattr(audio, "output", None) if audio else None
        if output is not None and output.voice is not None:
            live.settings.voice = getattr(output.voice, "id", output.voice)  # a custom voice
        if vad is not None:
            live.call.vad.reconfigure(vad)
            self._apply_turn_detection(detection)
        live.call.send_event(session_updated(live.session_object()))

    def _vad_config(self, detection: Any) -> VadConfig:
        """The VAD settings `detection` asks for; ValueError if they are not valid."""
        if detection.type != "server_vad":
            raise ValueError(f"turn_detection {detection.type!r} is not supported (server_vad)")
        changes: dict[str, int] = {}
        if detection.silence_duration_ms is not None:
            changes["silence_ms"] = detection.silence_duration_ms
        if detection.prefix_padding_ms is not None:
            changes["preroll_ms"] = detection.prefix_padding_ms
        if detection.threshold is not None:
            changes["aggressiveness"] = aggressiveness(detection.threshold)
        return dataclasses.replace(self.session.call.vad.config, **changes)

    def _apply_turn_detection(self, detection: Any) -> None:
        if detection.interrupt_response is not None:
            self.session.settings.barge_in = detection.interrupt_response
        if detection.create_response is not None:
            self.session.settings.create_response = detection.create_response

    def response_create(self, event: Any) -> None:
        if self.session.reply is not None:
            self.session.call.send_event(
                error_event(
                    "a response is already in progress",
                    code="conversation_already_has_active_response",
                    event_id=event.event_id,
                )
            )
            return
        self.session.start_reply()

    def response_cancel(self, event: Any) -> None:
        if self.session.reply is None:
            self.session.call.send_event(
                error_event(
                    "no response is in progress",
                    code="response_cancel_not_active",
                    event_id=event.event_id,
                )
            )
            return
        self.session.cancel_reply("client_cancelled")

    def output_audio_buffer_clear(self, event: Any) -> None:
        self.session.interrupt("client_cancelled")

    def input_audio_buffer_clear(self, event: Any) -> None:
        self.session.call.vad.clear()
        self.session.call.send_event(input_audio_buffer_cleared())

    def conversation_item_create(self, event: Any) -> None:
        item = event.item
        texts = [c.text for c in getattr(item, "content", None) or [] if getattr(c, "text", None)]
        if item.type != "message" or item.role != "user" or not texts:
            self.session.call.send_event(
                error_event(
                    "only user text messages can be added",
                    code="unsupported_item",
                    event_id=event.event_id,
                )
            )
            return
        item_id = item.id or new_id("item")
        text = " ".join(texts)
        self.session.conversation.add(item_id, "user", text)
        self.session.call.send_event(conversation_item_created(user_text_item(item_id, text)))
        if self.session.settings.create_response and self.session.reply is None:
            self.session.start_reply()

    def conversation_item_truncate(self, event: Any) -> None:
        replies = (self.session.reply, self.session.previous_reply)
        reply = next((r for r in replies if r is not None and r.item_id == event.item_id), None)
        item = self.session.conversation.get(event.item_id)
        if item is None or reply is None:
            self.session.call.send_event(
                error_event(
                    f"no assistant audio item {event.item_id!r}",
                    code="item_not_found",
                    event_id=event.event_id,
                )
            )
            return
        if not 0 <= event.audio_end_ms <= reply.spoken.total_ms:
            self.session.call.send_event(
                error_event(
                    f"audio_end_ms {event.audio_end_ms} is outside the item's audio "
                    f"(0..{reply.spoken.total_ms} ms)",
                    code="invalid_value",
                    event_id=event.event_id,
                    param="audio_end_ms",
                )
            )
            return
        # The audio stops now and the item keeps the text voiced by its first audio_end_ms; a
        # reply still generating is cancelled (its response.done carries that text too).
        if (self.session.reply is None or self.session.reply is reply) and self.session.interrupt(
            "client_cancelled", event.audio_end_ms
        ):
            return
        # Played out already, or a newer reply is under way: only the text is cut.
        reply.cut_ms = event.audio_end_ms
        item.text = self.session.heard(reply)
        self.session.call.send_event(conversation_item_truncated(item.item_id, event.audio_end_ms))
