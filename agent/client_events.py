"""What each Realtime client event does to a session (the session's half that listens)."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from agent import payloads
from agent.events import error_event, new_id, server_event
from media.vad import VadConfig

if TYPE_CHECKING:
    from agent.session import Session

log = logging.getLogger(__name__)

MAX_REPLY_TOKENS = 4096  # what "inf" means here: the Thinker's context bounds it anyway
# OpenAI's VAD threshold (0..1) onto webrtcvad's aggressiveness (0..3).
_THRESHOLDS = ((0.35, 0), (0.55, 1), (0.75, 2))


def aggressiveness(threshold: float) -> int:
    return next((mode for limit, mode in _THRESHOLDS if threshold < limit), 3)


class ClientEventDispatch:
    """Mixin of Session: one method per client event type."""

    def on_client_event(self: Session, event: Any) -> None:
        handler = getattr(self, "_on_" + event.type.replace(".", "_"), None)
        if handler is None:
            self.call.send_event(
                error_event(
                    f"{event.type} is not supported on a WebRTC call",
                    code="unsupported_event",
                    event_id=event.event_id,
                )
            )
            return
        handler(event)

    def _on_session_update(self: Session, event: Any) -> None:
        """Apply every change or none: a bad value is an `error` and the session stays as is."""
        session = event.session
        audio = getattr(session, "audio", None)
        detection = getattr(getattr(audio, "input", None), "turn_detection", None)
        max_tokens = getattr(session, "max_output_tokens", None)
        try:
            vad = self._vad_config(detection) if detection is not None else None
            if max_tokens not in (None, "inf") and not 1 <= max_tokens <= MAX_REPLY_TOKENS:
                raise ValueError(f"max_output_tokens must be 1..{MAX_REPLY_TOKENS} or 'inf'")
        except ValueError as exc:
            self.call.send_event(
                error_event(f"session.update: {exc}", code="invalid_value",
                            event_id=event.event_id)
            )
            return
        if max_tokens is not None:
            self.settings.max_reply_tokens = MAX_REPLY_TOKENS if max_tokens == "inf" else max_tokens
        if getattr(session, "instructions", None) is not None:
            self.settings.instructions = session.instructions
            self.conversation.instructions = session.instructions
        output = getattr(audio, "output", None) if audio else None
        if output is not None and output.voice is not None:
            self.settings.voice = getattr(output.voice, "id", output.voice)  # a custom voice
        if vad is not None:
            self.call.vad.reconfigure(vad)
            self._apply_turn_detection(detection)
        self.call.send_event(server_event("session.updated", session=self.session_object()))

    def _vad_config(self: Session, detection: Any) -> VadConfig:
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
        return dataclasses.replace(self.call.vad.config, **changes)

    def _apply_turn_detection(self: Session, detection: Any) -> None:
        if detection.interrupt_response is not None:
            self.settings.barge_in = detection.interrupt_response
        if detection.create_response is not None:
            self.settings.create_response = detection.create_response

    def _on_response_create(self: Session, event: Any) -> None:
        if self.reply is not None:
            self.call.send_event(
                error_event(
                    "a response is already in progress",
                    code="conversation_already_has_active_response",
                    event_id=event.event_id,
                )
            )
            return
        self.start_reply()

    def _on_response_cancel(self: Session, event: Any) -> None:
        if self.reply is None:
            self.call.send_event(
                error_event(
                    "no response is in progress",
                    code="response_cancel_not_active",
                    event_id=event.event_id,
                )
            )
            return
        self.cancel_reply("client_cancelled")

    def _on_output_audio_buffer_clear(self: Session, event: Any) -> None:
        self.interrupt("client_cancelled")

    def _on_input_audio_buffer_clear(self: Session, event: Any) -> None:
        self.call.vad.clear()
        self.call.send_event(server_event("input_audio_buffer.cleared"))

    def _on_conversation_item_create(self: Session, event: Any) -> None:
        item = event.item
        texts = [c.text for c in getattr(item, "content", None) or [] if getattr(c, "text", None)]
        if item.type != "message" or item.role != "user" or not texts:
            self.call.send_event(
                error_event(
                    "only user text messages can be added",
                    code="unsupported_item",
                    event_id=event.event_id,
                )
            )
            return
        item_id = item.id or new_id("item")
        text = " ".join(texts)
        self.conversation.add(item_id, "user", text)
        self.call.send_event(
            server_event("conversation.item.created", item=payloads.user_text_item(item_id, text))
        )
        if self.settings.create_response and self.reply is None:
            self.start_reply()

    def _on_conversation_item_truncate(self: Session, event: Any) -> None:
        replies = (self.reply, self._last_reply)
        reply = next((r for r in replies if r is not None and r.item_id == event.item_id), None)
        item = self.conversation.get(event.item_id)
        if item is None or reply is None:
            self.call.send_event(
                error_event(
                    f"no assistant audio item {event.item_id!r}",
                    code="item_not_found",
                    event_id=event.event_id,
                )
            )
            return
        if not 0 <= event.audio_end_ms <= reply.spoken.total_ms:
            self.call.send_event(
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
        if (self.reply is None or self.reply is reply) and self.interrupt(
            "client_cancelled", event.audio_end_ms
        ):
            return
        # Played out already, or a newer reply is under way: only the text is cut.
        reply.cut_ms = event.audio_end_ms
        item.text = self._heard(reply)
        self.call.send_event(
            server_event(
                "conversation.item.truncated",
                item_id=item.item_id,
                content_index=0,
                audio_end_ms=event.audio_end_ms,
            )
        )
