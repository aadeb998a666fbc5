"""`POST /v1/audio/speech`: the given text spoken by the profile's Talker and VoiceBox.

The text becomes a turn whose reply is recited, not written (`Turn.recite`): the Thinker hands
on the text's own tokens (and, for families that voice embeddings, their embeddings), and the
cascade voices it like any reply, so audio streams out chunk by chunk as it is rendered,
encoded as it comes (speech_audio.py) or as `speech.audio.delta` events (`stream_format: sse`).
The first audio is awaited before answering, so a request the models refuse (a voice the family
lacks) gets a 400, never a 200 with an empty body. Requests in flight are bounded on the
Talker's engine like completions on the Thinker's (429 with Retry-After beyond it).
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent.api.completion_slots import CompletionSlots
from agent.api.model_metrics import measured
from agent.api.model_run import CLIENT_GONE, ModelRun, RunStream, unless_gone
from agent.api.request_body import read_request
from agent.api.served_models import not_served, resolve
from agent.api.speech_audio import FORMATS, SpeechEncoder
from agent.calls.websocket_audio import WIRE_RATE, Resampler, pcm16
from agent.openai_errors import pipeline_refusal
from pipeline.turns.events import AudioChunk, Event, Turn, TurnDone, TurnFailed

log = logging.getLogger(__name__)
router = APIRouter()

MAX_BODY_BYTES = 64 << 10
MAX_INPUT_CHARS = 4096  # OpenAI's own bound
ENGINE = "talker"  # the engine whose slots bound speech requests


class VoiceId(BaseModel):
    """A voice named by object, `{"id": ...}` (OpenAI's custom voices)."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)


class SpeechRequest(BaseModel):
    """What omnivox honours of OpenAI's speech request; anything else is refused."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str = Field(min_length=1, max_length=MAX_INPUT_CHARS)
    voice: str | VoiceId
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = 1.0
    stream_format: Literal["audio", "sse"] = "audio"

    @field_validator("speed")
    @classmethod
    def _one_pace(cls, speed: float) -> float:
        if speed != 1.0:  # refused rather than ignored: another pace needs a time-stretch
            raise ValueError("only 1.0 is supported (the models speak at their own pace)")
        return speed

    def voice_name(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceId) else self.voice


@router.post("/v1/audio/speech", response_model=None)
@measured("speech")
async def speech(request: Request) -> Response:
    """The input text as audio in the format asked for, streamed as it is rendered."""
    asked = await read_request(request, SpeechRequest, MAX_BODY_BYTES)
    if isinstance(asked, JSONResponse):
        return asked
    model = resolve(request.app, asked.model)
    if model is None:
        return not_served(request.app, asked.model)
    slots: CompletionSlots = request.app.state.completion_slots
    if not slots.take(ENGINE):
        return slots.busy(ENGINE)
    speech_id = f"speech_{uuid.uuid4().hex[:20]}"
    turn = Turn(speech_id, [], voice=asked.voice_name(), call_id=speech_id, recite=asked.input)
    run: ModelRun[Event] = ModelRun(model.pipeline.respond(turn), slots, ENGINE)
    first = await unless_gone(request, first_audio(run))
    if first is None:
        await run.close()
        return Response(status_code=CLIENT_GONE)
    if isinstance(first, TurnFailed):
        await run.close()
        reason = getattr(first.error, "reason", "")
        return pipeline_refusal(first.error, "voice" if "voice" in reason else "input")
    if asked.stream_format == "sse":
        return RunStream(sse_events(run, first), run, "text/event-stream")
    return RunStream(audio_bytes(run, first, SpeechEncoder(asked.response_format)), run,
                     FORMATS[asked.response_format].media_type)


async def first_audio(run: ModelRun[Event]) -> AudioChunk | TurnDone | TurnFailed:
    """The turn's first audio, or how it ended without any."""
    while True:
        event = await run.next()
        if isinstance(event, (AudioChunk, TurnDone, TurnFailed)):
            return event


async def rendered(run: ModelRun[Event], first: AudioChunk | TurnDone
                   ) -> AsyncIterator[np.ndarray | TurnDone]:
    """The turn's audio as 24 kHz int16, chunk by chunk, then its TurnDone; a failure
    mid-way is raised (the response is cut short: its status has gone out)."""
    resampler = Resampler(WIRE_RATE)
    event: Event = first
    while True:
        if isinstance(event, AudioChunk):
            yield resampler.convert(pcm16(event.pcm), event.sample_rate)
        elif isinstance(event, TurnDone):
            yield event
            return
        elif isinstance(event, TurnFailed):
            raise event.error
        event = await run.next()


async def audio_bytes(run: ModelRun[Event], first: AudioChunk | TurnDone,
                      encoder: SpeechEncoder) -> AsyncIterator[bytes]:
    async for piece in rendered(run, first):
        if isinstance(piece, TurnDone):
            yield encoder.finish()
        elif data := encoder.feed(piece):
            yield data


async def sse_events(run: ModelRun[Event], first: AudioChunk | TurnDone
                     ) -> AsyncIterator[bytes]:
    """`speech.audio.delta` events of base64 pcm16, then `speech.audio.done` with usage."""
    async for piece in rendered(run, first):
        if isinstance(piece, TurnDone):
            yield sse({"type": "speech.audio.done", "usage": usage_of(piece)})
        else:
            yield sse({"type": "speech.audio.delta",
                       "audio": base64.b64encode(piece.astype("<i2").tobytes()).decode()})


def usage_of(done: TurnDone) -> dict[str, int]:
    """Tokens in (the recited text's) and out (speech tokens), as OpenAI counts them."""
    text = int(done.usage.get("thinker_tokens", 0))
    speech = int(done.usage.get("speech_tokens", 0))
    return {"input_tokens": text, "output_tokens": speech, "total_tokens": text + speech}


def sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()
