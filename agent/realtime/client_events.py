"""What each Realtime client event does to a session: a table from event type to handler."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent.realtime.function_calls import configure_tools
from agent.realtime.server_events import (
    conversation_item_created,
    conversation_item_truncated,
    error_event,
    function_call_output_item,
    input_audio_buffer_cleared,
    new_id,
    session_updated,
    user_text_item,
)
from agent.realtime.session_config import configure, text_only
from agent.realtime.voices import VOICE_PARAM, unknown_voice
from media.audio_format import SAMPLE_RATE

if TYPE_CHECKING:
    from agent.realtime.session import Session

log = logging.getLogger(__name__)
MIN_COMMIT_MS = 100  # OpenAI's least input audio a commit takes


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
            "input_audio_buffer.commit": self.input_audio_buffer_commit,
            "conversation.item.create": self.conversation_item_create,
            "conversation.item.truncate": self.conversation_item_truncate,
        }

    def dispatch(self, event: Any) -> None:
        """Run `event`'s handler; an event type with none gets an `error` event."""
        handler = self.handlers.get(event.type)
        if handler is None:
            self.session.call.send_event(
                error_event(
                    f"{event.type} is not supported on this call",
                    code="unsupported_event",
                    event_id=event.event_id,
                )
            )
            return
        handler(event)

    def session_update(self, event: Any) -> None:
        """Apply every change or none: a bad value (a model not served among them) is an
        `error` and the session stays as is."""
        live = self.session
        try:
            config = configure(event.session, live.config(), live.call.settings.vad)
            voice = config.conversation.voice
            refused = unknown_voice(voice, live.pipeline) if voice != live.settings.voice else None
            if refused is not None:
                live.call.send_event(error_event(f"session.update: {refused}",
                                                 code="invalid_value", event_id=event.event_id,
                                                 param=VOICE_PARAM))
                return
            model = getattr(event.session, "model", None)
            if model is not None:  # taken up at the next turn boundary (serving/binding.py)
                live.pin(model)
        except ValueError as exc:
            live.call.send_event(
                error_event(f"session.update: {exc}", code="invalid_value",
                            event_id=event.event_id)
            )
            return
        live.apply(config)
        live.call.send_event(session_updated(live.session_object()))

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
        response = event.response
        modalities = getattr(response, "output_modalities", None)
        try:
            text = text_only(modalities) if modalities is not None else None
            tools = configure_tools(response, self.session.tools) if response else None
        except ValueError as exc:
            self.session.call.send_event(error_event(
                f"response.create: {exc}", code="invalid_value", event_id=event.event_id,
                param="response"))
            return
        self.session.start_reply(text_only=text, tools=tools)

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
        self.session.call.clear_input()
        self.session.call.send_event(input_audio_buffer_cleared())

    def input_audio_buffer_commit(self, event: Any) -> None:
        """The caller's audio since the last commit becomes a turn (server VAD off: with it
        on, the VAD commits)."""
        call = self.session.call
        if call.server_vad:
            call.send_event(error_event(
                "input_audio_buffer.commit is supported with turn_detection null only (the "
                "server VAD commits the caller's turns)",
                code="unsupported_event", event_id=event.event_id))
            return
        pcm = call.take_input()
        if pcm is None or len(pcm) * 1000 // SAMPLE_RATE < MIN_COMMIT_MS:
            call.send_event(error_event(
                f"the input audio buffer holds less than {MIN_COMMIT_MS} ms of audio",
                code="input_audio_buffer_commit_empty", event_id=event.event_id))
            return
        self.session.commit(new_id("item"), pcm)

    def conversation_item_create(self, event: Any) -> None:
        item = event.item
        if item.type == "function_call_output":
            self.function_call_output(event)
            return
        texts = [c.text for c in getattr(item, "content", None) or [] if getattr(c, "text", None)]
        if item.type != "message" or item.role != "user" or not texts:
            self.session.call.send_event(
                error_event(
                    "only user text messages and function_call_output items can be added",
                    code="unsupported_item",
                    event_id=event.event_id,
                )
            )
            return
        item_id = item.id or new_id("item")
        text = " ".join(texts)
        self.session.conversation.add(item_id, "user", text)
        self.session.call.send_event(conversation_item_created(user_text_item(item_id, text)))
        settings = self.session.settings  # without server VAD the client asks for replies
        if settings.create_response and settings.server_vad and self.session.reply is None:
            self.session.start_reply()

    def function_call_output(self, event: Any) -> None:
        """What the client's function returned joins the history; the client then asks for
        the reply that uses it (response.create), as with OpenAI."""
        item, conversation = event.item, self.session.conversation
        if conversation.function_call(item.call_id) is None:
            self.session.call.send_event(error_event(
                f"no function call {item.call_id!r} in the conversation", code="item_not_found",
                event_id=event.event_id, param="item.call_id"))
            return
        item_id = item.id or new_id("item")
        conversation.add(item_id, "tool", item.output, call_id=item.call_id)
        self.session.call.send_event(conversation_item_created(
            function_call_output_item(item_id, item.call_id, item.output)))

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
