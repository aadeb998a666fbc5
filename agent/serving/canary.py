"""Canary turns: before a new model version takes a caller, it answers a few turns of its own,
each of which must end with audible speech; and a version that declares an output schema
(pipeline.version_checks.OUTPUT_SCHEMA) answers a chat completion guided by it, which must be
JSON valid against it."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import jsonschema
import numpy as np

from pipeline.errors import PipelineError
from pipeline.stage import ThinkerJob
from pipeline.turns.events import AudioChunk, Turn, TurnDone, TurnFailed

CANARY_QUESTION = "Hello, can you hear me? Please say something."
CANARY_TOKENS = 24  # a sentence or two: enough for the Talker and VoiceBox to speak
MIN_PEAK = 1 / 32768  # full scale 1.0: anything above digital silence
CANARY_JSON_TOKENS = 512  # room for a small object; one cut short fails the check


class CanaryFailed(Exception):
    """A canary turn that failed, timed out or said nothing audible (the message says which)."""


@dataclass(frozen=True)
class CanaryResult:
    audio_ms: int
    first_audio_s: float
    seconds: float


async def canary_turn(pipeline: Any, turn_id: str, instructions: str, voice: str,
                      timeout_s: float) -> CanaryResult:
    """One spoken turn on `pipeline`; CanaryFailed unless it ends with audible audio."""
    turn = Turn(turn_id, [{"role": "system", "content": instructions},
                          {"role": "user", "content": CANARY_QUESTION}],
                max_tokens=CANARY_TOKENS, voice=voice, call_id="canary")
    try:
        return await asyncio.wait_for(_spoken(pipeline, turn), timeout_s)
    except TimeoutError:
        await pipeline.cancel(turn_id)
        raise CanaryFailed(f"canary turn {turn_id} did not end within {timeout_s:g} s") from None


async def _spoken(pipeline: Any, turn: Turn) -> CanaryResult:
    started = time.monotonic()
    audio_ms, peak, first = 0, 0.0, None
    async for event in pipeline.respond(turn):
        if isinstance(event, AudioChunk):
            first = time.monotonic() - started if first is None else first
            audio_ms += len(event.pcm) * 1000 // event.sample_rate
            peak = max(peak, _peak(event.pcm))
        elif isinstance(event, TurnFailed):
            raise CanaryFailed(f"canary turn {turn.turn_id} failed: {event.error}")
        elif isinstance(event, TurnDone):
            break
    if audio_ms == 0 or peak < MIN_PEAK or first is None:
        raise CanaryFailed(f"canary turn {turn.turn_id} produced no audible audio "
                           f"({audio_ms} ms, peak {peak:.5f} of full scale)")
    return CanaryResult(audio_ms, round(first, 3), round(time.monotonic() - started, 3))


def _peak(pcm: np.ndarray) -> float:
    """The loudest sample, as a share of full scale (float PCM is in -1..1, int16 is not)."""
    if not len(pcm):
        return 0.0
    scale = 32768.0 if np.issubdtype(pcm.dtype, np.integer) else 1.0
    return float(np.abs(pcm.astype(np.float32)).max()) / scale


async def canary_json(pipeline: Any, request_id: str, schema: dict[str, Any],
                      timeout_s: float) -> dict[str, Any]:
    """One chat completion on `pipeline` guided by `schema`; CanaryFailed unless its answer
    is whole JSON that validates against `schema`. Its figures (tokens, seconds)."""
    job = ThinkerJob(request_id, [{"role": "system", "content": "Answer in JSON."},
                                  {"role": "user", "content": CANARY_QUESTION}],
                     max_tokens=CANARY_JSON_TOKENS, embeds=False, response_format={
                         "type": "json_schema",
                         "json_schema": {"name": "output_schema", "schema": schema}})
    try:
        return await asyncio.wait_for(_valid_json(pipeline, job, schema), timeout_s)
    except TimeoutError:
        raise CanaryFailed(f"canary completion {request_id} did not end within "
                           f"{timeout_s:g} s") from None
    except PipelineError as exc:
        raise CanaryFailed(f"canary completion {request_id} failed: {exc}") from None


async def _valid_json(pipeline: Any, job: ThinkerJob, schema: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    text, tokens, reason = [], 0, None
    async with aclosing(pipeline.generate_text(job)) as outputs:  # closing aborts it
        async for output in outputs:
            text.append(output.text)
            tokens += len(output.token_ids)
            if output.finished:
                reason = output.finish_reason
                break
    answer, what = "".join(text), f"canary completion {job.request_id} under its output schema"
    if reason == "length" or reason is None:
        raise CanaryFailed(f"{what} was cut at {job.max_tokens} tokens: {answer[:80]!r}")
    try:
        value = json.loads(answer)
    except ValueError as exc:
        raise CanaryFailed(f"{what} is not valid JSON ({exc}): {answer[:80]!r}") from None
    error = jsonschema.exceptions.best_match(
        jsonschema.validators.validator_for(schema)(schema).iter_errors(value))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "the answer"
        raise CanaryFailed(f"{what} does not follow it: at {where}, {error.message}")
    return {"tokens": tokens, "seconds": round(time.monotonic() - started, 3)}
