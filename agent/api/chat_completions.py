"""`POST /v1/chat/completions` on the profile's Thinker: text in, text out, streamed or not.

The request becomes a text-only Thinker job (`Pipeline.generate_text`) in the same worker and
engine as the calls' turns. The first output is awaited before answering, so a request the
engine refuses (a schema it cannot enforce, a prompt too long) gets a 400, never a 200 with free
text. A streamed request's client that goes away aborts its engine request; completions in
flight per engine are bounded (completion_slots.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from agent.api.chat_request import ChatCompletionRequest
from agent.api.chat_response import DONE, Completion, finish_reason, sse
from agent.api.chat_tools import message_of, tool_calls
from agent.api.completion_slots import CompletionSlots
from agent.api.model_metrics import measured
from agent.api.model_run import CLIENT_GONE, ModelRun, RunStream, unless_gone
from agent.api.request_body import read_request
from agent.api.served_models import not_served, resolve
from agent.guided.functions import Answer, read_answer
from agent.openai_errors import (
    BUSY_RETRY_S,
    NOT_READY_RETRY_S,
    openai_error,
)
from pipeline.errors import (
    PipelineBusyError,
    PipelineError,
    PipelineNotRunningError,
    RequestFailedError,
    StageFailedError,
    StageStalledError,
)
from pipeline.sampling_options import SamplingOptions
from pipeline.stage import ThinkerJob, ThinkerOutput

log = logging.getLogger(__name__)
router = APIRouter()

MAX_BODY_BYTES = 1 << 20
ENGINE = "thinker"  # the stage whose engine serves completions
# Errors a Thinker raises for the request itself, not for its state: the client's to fix.
REQUEST_ERRORS = ("VLLMValidationError", "ValueError")


@router.post("/v1/chat/completions", response_model=None)
@measured("chat_completions")
async def chat_completions(request: Request) -> Response:
    """A chat completion from the Thinker of the model named."""
    chat = await read_request(request, ChatCompletionRequest, MAX_BODY_BYTES)
    if isinstance(chat, JSONResponse):
        return chat
    model = resolve(request.app, chat.model)
    if model is None:
        return not_served(request.app, chat.model)
    slots: CompletionSlots = request.app.state.completion_slots
    if not slots.take(ENGINE):
        return slots.busy(ENGINE)
    completion = Completion(model.id)
    run: ModelRun[ThinkerOutput] | None = None
    try:
        run = ModelRun(model.pipeline.generate_text(thinker_job(chat, completion)),
                       slots, ENGINE)
        first = await unless_gone(request, run.next())
    except (PipelineError, StopAsyncIteration) as exc:
        if run is None:
            slots.give_back(ENGINE)
        else:
            await run.close()
        return refused(request, chat, exc)
    if first is None:
        await run.close()
        return Response(status_code=CLIENT_GONE)
    if chat.stream:  # from here, the streamed response itself hears of a client that left
        return RunStream(stream(run, first, chat, completion), run, "text/event-stream")
    try:
        answer = await unless_gone(request, whole(run, first, chat, completion))
        return Response(status_code=CLIENT_GONE) if answer is None else answer
    except PipelineError as exc:
        return refused(request, chat, exc)
    finally:
        await run.close()


def thinker_job(chat: ChatCompletionRequest, completion: Completion) -> ThinkerJob:
    """The text-only Thinker job of a request."""
    options = SamplingOptions(temperature=chat.temperature, top_p=chat.top_p, seed=chat.seed,
                              stop=chat.stops())
    return ThinkerJob(f"completions/{completion.id}/{ENGINE}/0", chat.thinker_messages(),
                      max_tokens=chat.reply_tokens(), response_format=chat.thinker_format(),
                      sampling=options, embeds=False)


def answer_of(chat: ChatCompletionRequest, text: str, engine_reason: str | None
              ) -> tuple[Answer, str]:
    """The reply as words or tool calls, and its finish reason."""
    if not chat.calls_tools():
        return Answer(text), finish_reason(engine_reason)
    answer = read_answer(text)
    return answer, "tool_calls" if answer.calls else finish_reason(engine_reason)


async def whole(run: ModelRun[ThinkerOutput], output: ThinkerOutput, chat: ChatCompletionRequest,
                completion: Completion) -> JSONResponse:
    """Collect the reply, then answer it in one piece."""
    text: list[str] = []
    while True:
        completion.count(output)
        text.append(output.text)
        if output.finished:
            answer, reason = answer_of(chat, "".join(text), output.finish_reason)
            return JSONResponse(completion.whole(message_of(answer), reason))
        output = await run.next()


async def stream(run: ModelRun[ThinkerOutput], output: ThinkerOutput, chat: ChatCompletionRequest,
                 completion: Completion) -> AsyncIterator[bytes]:
    """The reply as chunks: the role first, then text deltas, then the finish reason (and the
    usage chunk when asked for), then [DONE]. An error mid-stream is an error event, last.
    An answer in the tool format is read whole first, then sent as one delta of its content
    or its tool call."""
    usage, held = chat.include_usage(), chat.calls_tools()
    text: list[str] = []
    try:
        yield sse(completion.chunk({"role": "assistant", "content": ""}, with_usage=usage))
        while True:
            completion.count(output)
            if output.text and not held:
                yield sse(completion.chunk({"content": output.text}, with_usage=usage))
            text.append(output.text)
            if output.finished:
                break
            output = await run.next()
        answer, reason = answer_of(chat, "".join(text), output.finish_reason)
        if held:
            delta = ({"tool_calls": [{"index": i, **call}
                                     for i, call in enumerate(tool_calls(answer))]}
                     if answer.calls else {"content": answer.content})
            yield sse(completion.chunk(delta, with_usage=usage))
        yield sse(completion.chunk({}, reason, with_usage=usage))
        if usage:
            yield sse(completion.usage_chunk())
        yield DONE
    except PipelineError as exc:
        log.warning("completion %s failed mid-stream: %s", completion.id, exc)
        yield sse({"error": error_body(exc)})
    finally:
        with suppress(Exception):  # aborts the engine request when the client went away
            await run.close()


def error_body(exc: BaseException) -> dict[str, Any]:
    return {"message": str(exc), "type": "server_error", "param": None, "code": "model_error"}


def refused(request: Request, chat: ChatCompletionRequest, exc: BaseException) -> JSONResponse:
    """The answer for a request the pipeline did not serve: the client's fault (400), the
    Thinker not ready (503), busy (429), or ours (500)."""
    if isinstance(exc, RequestFailedError) and exc.reason.startswith(REQUEST_ERRORS):
        if exc.reason.startswith("VLLMValidationError") and chat.response_format is not None:
            return openai_error(400, "invalid_response_format", f"response_format cannot be "
                                f"enforced: {exc.reason}", param="response_format")
        code = "context_length_exceeded" if "max_model_len" in exc.reason else "invalid_request"
        return openai_error(400, code, exc.reason, param="messages")
    if isinstance(exc, (StageFailedError, PipelineNotRunningError, StageStalledError)):
        readiness = request.app.state.readiness
        if ENGINE in readiness.failed():  # given up for good: an operator must act
            return openai_error(503, "stage_failed", str(exc), kind="server_error")
        return openai_error(503, "not_ready", str(exc), kind="server_error",
                            **{"Retry-After": str(NOT_READY_RETRY_S)})
    if isinstance(exc, PipelineBusyError):
        return openai_error(429, "too_many_requests", str(exc), kind="rate_limit_error",
                            **{"Retry-After": str(BUSY_RETRY_S)})
    log.error("completion refused: %r", exc)
    return openai_error(500, "model_error", f"the model failed: {exc}", kind="server_error")
