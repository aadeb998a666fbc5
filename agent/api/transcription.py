"""`POST /v1/audio/transcriptions`: what a speaker said in an uploaded file, for families whose
Thinker recognises speech (the local family's Whisper).

The file (any format FFmpeg decodes) becomes the caller's audio of a turn that only hears
(`Turn.transcribe`): the Thinker's worker transcribes it as it does a caller's utterance and
answers nothing, so transcriptions share the recogniser with live calls. The audio travels in
one pool block, which bounds its length (`pool.block_size`: 32 s by default). Requests in
flight are bounded on the Thinker like completions (429 with Retry-After beyond it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from typing import Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict

from agent.api.completion_slots import CompletionSlots
from agent.api.model_metrics import measured
from agent.api.model_run import CLIENT_GONE, ModelRun, unless_gone
from agent.api.request_body import BadRequest, parse_body
from agent.api.served_models import not_served, resolve
from agent.calls.signalling import read_body
from agent.form_data import MULTIPART, form_parts
from agent.openai_errors import openai_error, pipeline_refusal
from media.audio_file import AudioFileError, decode_audio_file
from media.audio_format import SAMPLE_RATE
from pipeline.turns.events import Event, Transcript, Turn, TurnDone, TurnFailed

log = logging.getLogger(__name__)
router = APIRouter()

MAX_BODY_BYTES = 25 << 20  # OpenAI's bound on the file
ENGINE = "thinker"  # the stage that hears


class TranscriptionRequest(BaseModel):
    """The form's fields omnivox honours (the file aside); others are refused, not ignored."""

    model_config = ConfigDict(extra="forbid")

    model: str
    language: Literal["en"] | None = None  # the recogniser is English-only (Whisper tiny.en)
    response_format: Literal["json", "text", "verbose_json"] = "json"
    temperature: Literal["0", "0.0"] | None = None  # decoding is the recogniser's own


@router.post("/v1/audio/transcriptions", response_model=None)
@measured("transcriptions")
async def transcriptions(request: Request) -> Response:
    """The text of the uploaded speech."""
    form = await read_form(request)
    if isinstance(form, Response):
        return form
    asked, data = form
    model = resolve(request.app, asked.model)
    if model is None:
        return not_served(request.app, asked.model)
    if not model.recognises_speech:
        return openai_error(400, "invalid_request", f"the model {model.id} does not transcribe "
                            f"speech (its family's Thinker hears audio without writing it down)",
                            param="model")
    block = model.pipeline.settings.pool.block_size
    try:
        # Off the event loop, as the form's parsing: measured 80 ms to decode 30 s of WAV and
        # 80 ms to parse its 1 MB form (a 25 MB one: seconds), each a stall in every call's pacing.
        audio = await asyncio.to_thread(decode_audio_file, data, block / 2 / SAMPLE_RATE)
    except AudioFileError as exc:
        return openai_error(400, "invalid_file", str(exc), param="file")
    slots: CompletionSlots = request.app.state.completion_slots
    if not slots.take(ENGINE):
        return slots.busy(ENGINE)
    turn_id = f"transcription_{uuid.uuid4().hex[:20]}"
    turn = Turn(turn_id, [], audio=audio, call_id=turn_id, speak=False, transcribe=True)
    run: ModelRun[Event] = ModelRun(model.pipeline.respond(turn), slots, ENGINE)
    try:
        heard = await unless_gone(request, transcript_of(run))
    finally:
        await run.close()
    if heard is None:
        return Response(status_code=CLIENT_GONE)
    if isinstance(heard, TurnFailed):
        return pipeline_refusal(heard.error, "file")
    return answer(asked, heard, len(audio) / SAMPLE_RATE)


async def read_form(request: Request) -> tuple[TranscriptionRequest, bytes] | Response:
    """The form's fields and file, or the refusal: 415 not a form, 413 too large, 400."""
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != MULTIPART:
        return openai_error(415, "unsupported_media_type", f"send the file as {MULTIPART}")
    body = await read_body(request, MAX_BODY_BYTES)
    if body is None:
        return openai_error(413, "request_too_large",
                            f"the request body exceeds {MAX_BODY_BYTES} bytes")
    parts = await asyncio.to_thread(form_parts, content_type, body)
    if parts is None or "file" not in parts:
        return openai_error(400, "invalid_request", "the form has no 'file' part", param="file")
    data = parts.pop("file")
    try:
        fields = {name: value.decode("utf-8") for name, value in parts.items()}
        return parse_body(TranscriptionRequest, fields), data
    except UnicodeDecodeError:
        return openai_error(400, "invalid_request", "form fields must be UTF-8 text")
    except BadRequest as exc:
        return openai_error(400, "invalid_request", str(exc), param=exc.param)


async def transcript_of(run: ModelRun[Event]) -> str | TurnFailed:
    """What the Thinker heard ("" for no speech), or how the turn failed."""
    heard = ""
    while True:
        event = await run.next()
        if isinstance(event, Transcript):
            heard = event.text
        elif isinstance(event, (TurnDone, TurnFailed)):
            return event if isinstance(event, TurnFailed) else heard


def answer(asked: TranscriptionRequest, text: str, seconds: float) -> Response:
    if asked.response_format == "text":
        return PlainTextResponse(text + "\n")
    if asked.response_format == "verbose_json":
        return JSONResponse({"task": "transcribe", "language": "english",
                             "duration": round(seconds, 3), "text": text})
    return JSONResponse({"text": text, "usage": {"type": "duration",
                                                  "seconds": math.ceil(seconds)}})
