"""A transcription session (`session.type: "transcription"`): each utterance the VAD commits is
written down by the model's own recogniser and told as transcription events; nothing answers."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from agent.realtime.history import Conversation
from agent.realtime.server_events import (
    input_audio_transcription_completed,
    input_audio_transcription_delta,
    input_audio_transcription_failed,
)
from agent.realtime.transport import CallTransport
from pipeline.families import recognises_speech
from pipeline.turns.events import Transcript, Turn, TurnDone, TurnFailed

log = logging.getLogger(__name__)


def writes_speech_down(pipeline: object) -> bool:
    """Whether the family behind `pipeline` writes speech down (transcriptions); False for a
    pipeline that names no family (a stand-in)."""
    family = getattr(getattr(pipeline, "settings", None), "family", None)
    return isinstance(family, str) and recognises_speech(family)


async def transcribe(pipeline: Any, call: CallTransport, conversation: Conversation,
                     item_id: str, pcm: np.ndarray) -> None:
    """Hear the utterance `item_id` on `pipeline` and tell the call what was said (or that it
    could not be heard); its item in `conversation` keeps the words."""
    turn_id = f"{item_id}-heard"
    turn = Turn(turn_id, [], audio=pcm, call_id=call.id, speak=False, transcribe=True)
    heard: str | None = None
    finished = False
    try:
        async for event in pipeline.respond(turn):
            if isinstance(event, Transcript):
                heard = event.text
            elif isinstance(event, TurnFailed):
                finished = True
                log.warning("call %s: %s not heard: %s", call.id, item_id, event.error)
                call.send_event(input_audio_transcription_failed(
                    item_id, str(event.error)))
                return
            elif isinstance(event, TurnDone):
                finished = True
    finally:
        if not finished:  # the call ended first: the recogniser lets go of it too
            await pipeline.cancel(turn_id)
    text = heard or ""
    item = conversation.get(item_id)
    if item is not None:
        item.text = text
    call.send_event(input_audio_transcription_delta(item_id, text))
    call.send_event(input_audio_transcription_completed(item_id, text))
