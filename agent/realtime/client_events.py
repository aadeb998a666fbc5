"""What each Realtime client event does to a session: a table from event type to handler."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from agent.config import ConversationSettings
from agent.realtime.aliases import model_alias, transcription_alias
from agent.realtime.function_calls import SessionTools, configure_tools
from agent.realtime.history import Conversation
from agent.realtime.reply import Reply
from agent.realtime.server_events import (
    conversation_item_deleted,
    conversation_item_retrieved,
    conversation_item_truncated,
    error_event,
    function_call_output_item,
    history_item,
    input_audio_buffer_cleared,
    item_added_and_done,
    new_id,
    session_updated,
    user_text_item,
)
from agent.realtime.session_config import (
    NoTranscriptionsError,
    SessionConfig,
    UnknownTranscriberError,
    configure,
    text_only,
    transcription_model,
    update_fields,
)
from agent.realtime.transcribing import writes_speech_down
from agent.realtime.transport import CallTransport
from agent.realtime.voices import check_voice
from media.audio_format import SAMPLE_RATE

log = logging.getLogger(__name__)
MIN_COMMIT_MS = 100  # OpenAI's least input audio a commit takes


class EventTarget(Protocol):
    """What the client's events act on: the session's live configuration and the model behind
    it (session.update), its replies (response.*, output_audio_buffer.clear), the caller's
    committed audio (input_audio_buffer.*) and its history (conversation.item.*)."""

    @property
    def call(self) -> CallTransport: ...

    # -- the configuration, and the model it names --
    @property
    def config(self) -> SessionConfig: ...

    @property
    def settings(self) -> ConversationSettings: ...

    @property
    def tools(self) -> SessionTools: ...

    def apply(self, config: SessionConfig) -> None: ...

    def session_object(self) -> dict[str, Any]: ...

    @property
    def pipeline(self) -> Any: ...

    @property
    def model_id(self) -> str: ...

    def spoken(self, voice: str) -> str: ...

    def serves(self, model_id: str) -> bool: ...

    def pin(self, model_id: str) -> None: ...

    def aliased(self, kind: str, asked: str, meant: str) -> None: ...

    # -- replies --
    @property
    def reply(self) -> Reply | None: ...

    @property
    def cancelling(self) -> Reply | None: ...

    @property
    def previous_reply(self) -> Reply | None: ...

    def start_reply(self, text_only: bool | None = None, tools: SessionTools | None = None,
                    metadata: dict[str, str] | None = None) -> Reply: ...

    def cancel_reply(self, reason: str = "client_cancelled",
                     audio_end_ms: int | None = None) -> bool: ...

    def interrupt(self, reason: str, audio_end_ms: int | None = None) -> bool: ...

    def heard(self, reply: Reply) -> str: ...

    # -- the caller's audio and the history --
    def commit(self, item_id: str, pcm: np.ndarray) -> None: ...

    @property
    def conversation(self) -> Conversation: ...


class ClientEvents:
    """The session's half that listens: one handler per client event type, in one table."""

    def __init__(self, session: EventTarget) -> None:
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
            "conversation.item.retrieve": self.conversation_item_retrieve,
            "conversation.item.delete": self.conversation_item_delete,
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
        """Apply every change or none, as OpenAI does: a refused value is an `error` that names
        it and the fields left unapplied, and the session stays as it was. OpenAI's own names
        (aliases.py) are taken as what they mean here."""
        live = self.session
        try:
            config, aliased, pin = self._checked(event.session)
            if pin is not None:  # taken up at the next turn boundary (serving/binding.py)
                live.pin(pin)
        except ValueError as exc:
            fields = ", ".join(update_fields(event.session)) or "none"
            live.call.send_event(error_event(
                f"session.update: {exc} (nothing of this update was applied; it set {fields})",
                code="invalid_value", event_id=event.event_id,
                param=getattr(exc, "param", None)))
            return
        live.apply(config)
        for kind, asked, meant in aliased:
            live.aliased(kind, asked, meant)
        live.call.send_event(session_updated(live.session_object()))

    def _checked(self, update: Any) -> tuple[SessionConfig, list[tuple[str, str, str]],
                                             str | None]:
        """The session `update` asks for, the OpenAI names it used with what they mean here,
        and the model version to pin (None: the call's own); ValueError naming a refusal."""
        live = self.session
        aliases = live.call.settings.aliases
        config = configure(update, live.config, live.call.settings.vad)
        if config.conversation.transcription_only and not writes_speech_down(live.pipeline):
            raise NoTranscriptionsError(f"the model {live.model_id} does not write speech down: "
                                        "transcription sessions need a family that does "
                                        "(local, omni, orpheus)")
        aliased: list[tuple[str, str, str]] = []
        asked_voice = config.conversation.voice
        if asked_voice != live.settings.voice:
            voice = live.spoken(asked_voice)
            check_voice(voice, live.pipeline)
            if voice != asked_voice:
                aliased.append(("voice", asked_voice, voice))
                config = dataclasses.replace(config, conversation=config.conversation.model_copy(
                    update={"voice": voice}))
        model = getattr(update, "model", None)
        if model is not None and model_alias(aliases, model) and not live.serves(model):
            aliased.append(("model", model, live.model_id))
            model = None
        transcriber = transcription_model(update)
        if transcriber is not None and not live.serves(transcriber):
            if not transcription_alias(aliases, transcriber):
                raise UnknownTranscriberError(
                    f"transcription model {transcriber!r} is not served here: this session's "
                    f"speech is transcribed by {live.model_id}")
            aliased.append(("transcription_model", transcriber, live.model_id))
        return config, aliased, model

    def response_create(self, event: Any) -> None:
        if self.session.settings.transcription_only:
            self.session.call.send_event(error_event(
                "a transcription session writes speech down and answers nothing",
                code="unsupported_event", event_id=event.event_id))
            return
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
        metadata = getattr(response, "metadata", None)
        self.session.start_reply(text_only=text, tools=tools,
                                 metadata=dict(metadata) if metadata else None)

    def response_cancel(self, event: Any) -> None:
        if self.session.reply is None:
            self.session.call.send_event(
                error_event(
                    # OpenAI's words: LiveKit's plugin tells this error apart by them
                    "Cancellation failed: no active response found",
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
        if self.session.settings.server_vad:
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
        # As with OpenAI, an item starts no response: the client asks with response.create
        # (several items may come first).
        for added in item_added_and_done(user_text_item(item_id, text)):
            self.session.call.send_event(added)

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
        for added in item_added_and_done(
                function_call_output_item(item_id, item.call_id, item.output)):
            self.session.call.send_event(added)

    def conversation_item_retrieve(self, event: Any) -> None:
        """The item as the history holds it now (a heard utterance with its transcript)."""
        item = self.session.conversation.get(event.item_id)
        if item is None:
            self._no_item(event)
            return
        reply = self.session.reply
        live = reply is not None and item.item_id in (reply.item_id, reply.call_item_id)
        self.session.call.send_event(conversation_item_retrieved(history_item(
            item, "in_progress" if live else "completed", self.session.settings.text_only)))

    def conversation_item_delete(self, event: Any) -> None:
        """The item leaves the history: the Thinker's next turn no longer sees it. The item of
        the reply under way stays until it ends (cancel it first)."""
        reply = self.session.reply
        if reply is not None and event.item_id in (reply.item_id, reply.call_item_id):
            self.session.call.send_event(error_event(
                f"item {event.item_id!r} belongs to the response in progress; cancel it first",
                code="invalid_value", event_id=event.event_id, param="item_id"))
            return
        if not self.session.conversation.delete(event.item_id):
            self._no_item(event)
            return
        self.session.call.send_event(conversation_item_deleted(event.item_id))

    def _no_item(self, event: Any) -> None:
        self.session.call.send_event(error_event(
            f"no item {event.item_id!r} in the conversation", code="item_not_found",
            event_id=event.event_id, param="item_id"))

    def conversation_item_truncate(self, event: Any) -> None:
        # A reply cut off a moment ago is still aborting: clients truncate it at speech_started.
        replies = (self.session.reply, self.session.cancelling, self.session.previous_reply)
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
        live = self.session.reply is None or self.session.reply is reply
        if (live and reply is not self.session.cancelling
                and self.session.interrupt("client_cancelled", event.audio_end_ms)):
            return
        # Played out already, silenced already, or a newer reply is under way: only the text
        # is cut (a reply still aborting ends with that text).
        reply.cut_ms = event.audio_end_ms
        item.text = self.session.heard(reply)
        self.session.call.send_event(conversation_item_truncated(item.item_id, event.audio_end_ms))
