"""One agent reply (a Realtime response) and the events that close it."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any

from agent.guided.functions import FunctionCall
from agent.realtime.history import SpokenText
from agent.realtime.server_events import (
    assistant_item,
    conversation_item_done,
    error_event,
    function_call_item,
    output_audio_done,
    output_audio_transcript_done,
    output_item_done,
    output_text_done,
    response_done,
    response_object,
)
from pipeline.turns.events import Turn


class State(enum.StrEnum):
    LISTENING = "listening"
    THINKING = "thinking"
    SPEAKING = "speaking"


@dataclass
class Reply:
    """One response in flight: its ids, text so far, and the audio it queued."""

    response_id: str
    item_id: str
    turn_id: str
    user_item_id: str | None
    text_only: bool = False  # output_modalities ["text"]: the reply's audio is not sent
    metadata: dict[str, str] | None = None  # the client's, from response.create, given back
    text: str = ""
    spoken: SpokenText = field(default_factory=SpokenText)
    audio_base_ms: int | None = None  # call's played_ms at which this reply's audio begins
    # Loop times: the reply began (for a spoken turn: when the VAD closed the utterance), its
    # first audio was queued, and its first frame was handed to the sender.
    started_at: float = 0.0
    first_audio_at: float | None = None
    first_frame_at: float | None = None
    usage: dict[str, Any] | None = None  # the pipeline's counts and stage times (TurnDone)
    task: asyncio.Task[None] | None = None
    finished: bool = False
    audio_state: str = "idle"  # idle -> started -> stopped (the output audio buffer's events)
    underruns: int = 0  # the queue ran dry mid-reply (the next chunk came late)
    cut_ms: int | None = None  # the audio was cut here: what was heard no longer grows
    cancel_reason: str | None = None  # why it was cut off (its response.done says so)
    # Function calling (function_calls.py): the Thinker answers in JSON first, read whole; its
    # message item is announced only once the answer is words (then voiced by `follow_up`).
    answers_in_json: bool = False
    announced: bool = False  # its message item went out (Session.announce)
    call: FunctionCall | None = None
    call_item_id: str = ""
    follow_up: Turn | None = None

    def played_ms(self, call_played_ms: int) -> int:
        if self.cut_ms is not None:
            return self.cut_ms
        if self.audio_base_ms is None:
            return 0
        return max(0, min(call_played_ms - self.audio_base_ms, self.spoken.total_ms))


def done_events(
    reply: Reply,
    status: str,
    transcript: str,
    usage: dict[str, Any] | None,
    error: str | None,
    reason: str | None,
) -> list[dict[str, Any]]:
    """What ends a reply, in order: an error (failed), the transcript and audio dones
    (completed), the output item, then response.done with the status."""
    response_id, item_id = reply.response_id, reply.item_id
    events = []
    if error:
        events.append(error_event(error, code="response_failed", error_type="server_error"))
    if reply.call is not None or not reply.announced:
        return [*events, *_items_done(reply, status, usage, error, reason)]
    if status == "completed" and reply.text_only:
        events.append(output_text_done(response_id, item_id, transcript))
    elif status == "completed":
        events.append(output_audio_transcript_done(response_id, item_id, transcript))
        events.append(output_audio_done(response_id, item_id))
    item_status = "completed" if status == "completed" else "incomplete"
    item = assistant_item(item_id, transcript, item_status, reply.text_only)
    events += [output_item_done(response_id, item), conversation_item_done(item)]
    body = response_object(response_id, status, [item], usage=usage, reason=reason, error=error,
                           text_only=reply.text_only, metadata=reply.metadata)
    events.append(response_done(body))
    return events


def _items_done(reply: Reply, status: str, usage: dict[str, Any] | None, error: str | None,
                reason: str | None) -> list[dict[str, Any]]:
    """The end of a reply with no message item: its function call, or nothing at all (ended
    before the answer was read)."""
    output, events = [], []
    if reply.call is not None:
        call = reply.call
        item = function_call_item(reply.call_item_id, call.call_id, call.name, call.arguments,
                                  "completed")
        output.append(item)
        events += [output_item_done(reply.response_id, item), conversation_item_done(item)]
    body = response_object(reply.response_id, status, output, usage=usage, reason=reason,
                           error=error, text_only=reply.text_only, metadata=reply.metadata)
    return [*events, response_done(body)]
