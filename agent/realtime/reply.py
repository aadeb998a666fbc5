"""One agent reply (a Realtime response) and the events that close it."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any

from agent.realtime import payloads
from agent.realtime.events import error_event, server_event
from agent.realtime.history import SpokenText


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

    def played_ms(self, call_played_ms: int) -> int:
        if self.cut_ms is not None:
            return self.cut_ms
        if self.audio_base_ms is None:
            return 0
        return max(0, min(call_played_ms - self.audio_base_ms, self.spoken.total_ms))


def reply_event(reply: Reply, event_type: str, **fields: Any) -> dict[str, Any]:
    """A server event about the reply's one audio output item."""
    return server_event(
        event_type,
        response_id=reply.response_id,
        item_id=reply.item_id,
        output_index=0,
        content_index=0,
        **fields,
    )


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
    events = []
    if error:
        events.append(error_event(error, code="response_failed", error_type="server_error"))
    if status == "completed":
        events.append(
            reply_event(reply, "response.output_audio_transcript.done", transcript=transcript)
        )
        events.append(reply_event(reply, "response.output_audio.done"))
    item = payloads.assistant_item(
        reply.item_id, transcript, "completed" if status == "completed" else "incomplete"
    )
    events.append(
        server_event(
            "response.output_item.done", response_id=reply.response_id, output_index=0, item=item
        )
    )
    body = payloads.response(
        reply.response_id,
        status,
        [item],
        usage=usage,
        reason=reason,
        error={"type": "server_error", "message": error} if error else None,
    )
    events.append(server_event("response.done", response=body))
    return events
