"""What each pipeline event of a reply's turn does on the call: text deltas and the caller's
transcript out as Realtime events, audio played (its first chunk timed), and the reply finished
when the turn is done or failed (an answer in JSON is read whole: tool_answers.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from agent.realtime.reply import Reply, State
from agent.realtime.server_events import (
    input_audio_transcription_completed,
    input_audio_transcription_delta,
    output_audio_transcript_delta,
    output_text_delta,
    usage_object,
)
from agent.realtime.tool_answers import Replying, answered, merged_usage
from pipeline.turns.events import AudioChunk, TextDelta, Transcript, TurnDone, TurnFailed

log = logging.getLogger(__name__)


class Speaking(Replying, Protocol):
    """What a reply's events need of the session: what its answer needs (tool_answers.py),
    and the session's state, which is SPEAKING from the reply's first audio."""

    state: State


async def on_pipeline_event(session: Speaking, reply: Reply, event: Any) -> None:
    """What one event of the pipeline turn running `reply` does on the call."""
    if isinstance(event, TextDelta):
        reply.text += event.text
        if reply.answers_in_json:
            return  # read whole at the end (tool_answers.py)
        delta = output_text_delta if reply.text_only else output_audio_transcript_delta
        session.call.send_event(delta(reply.response_id, reply.item_id, event.text))
    elif isinstance(event, AudioChunk) and not reply.text_only:
        await _play(session, reply, event)
    elif isinstance(event, Transcript):
        _user_transcript(session, reply, event.text)
    elif isinstance(event, TurnDone) and reply.answers_in_json:
        answered(session, reply, event)
    elif isinstance(event, TurnDone):
        reply.text = event.text
        reply.usage = merged_usage(reply.usage, event.usage)
        session.finish(reply, "completed", usage=usage_object(reply.usage))
    elif isinstance(event, TurnFailed):
        session.finish(reply, "failed", error=str(event.error))


async def _play(session: Speaking, reply: Reply, chunk: AudioChunk) -> None:
    """A chunk of the reply's audio to the caller; the first one marks when it began to speak."""
    outbound = session.call.outbound
    if reply.audio_base_ms is None:
        reply.audio_base_ms = outbound.played_ms + outbound.queued_ms
        reply.first_audio_at = asyncio.get_running_loop().time()
        session.state = State.SPEAKING
        session.call.metrics.first_audio(reply.first_audio_at - reply.started_at)
        log.info(
            "call %s: first audio %.0f ms after the turn began",
            session.call.id,
            (reply.first_audio_at - reply.started_at) * 1000,
        )
    duration_ms = len(chunk.pcm) * 1000 // chunk.sample_rate
    reply.spoken.add_chunk(duration_ms, chunk.text_start, chunk.text_end)
    await session.call.play(reply.response_id, reply.item_id, chunk.pcm, chunk.sample_rate)


def _user_transcript(session: Replying, reply: Reply, text: str) -> None:
    """What the caller said, as the recogniser heard it: onto its item, and to the client."""
    if reply.user_item_id is None:
        return
    item = session.conversation.get(reply.user_item_id)
    if item is not None:
        item.text = text
    # The recogniser hears the utterance whole: its transcript is one delta, then completed.
    session.call.send_event(input_audio_transcription_delta(reply.user_item_id, text))
    session.call.send_event(input_audio_transcription_completed(reply.user_item_id, text))
