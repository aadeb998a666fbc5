"""Errors in OpenAI's JSON shape for the model-serving routes: `message`, `type`, `param` (the
request field at fault, or null) and `code`, under `error`, as the `openai` SDK reads them."""

from __future__ import annotations

import logging

from fastapi.responses import JSONResponse

from pipeline.errors import PipelineBusyError, PipelineError, RequestFailedError

log = logging.getLogger(__name__)
BUSY_RETRY_S = 1  # a short request ends within a second or two: try again soon
NOT_READY_RETRY_S = 5  # stages (re)starting take seconds


def openai_error(status: int, code: str, message: str, *, param: str | None = None,
                 kind: str = "invalid_request_error", **headers: str) -> JSONResponse:
    """The response a refused model request gets; `headers` such as Retry-After go with it."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers or None)


def pipeline_refusal(error: PipelineError, param: str) -> JSONResponse:
    """The answer for model work the pipeline did not do: the request's fault (400 naming
    `param`: a stage refused it with a ValueError), busy (429), a model failure (500), or the
    stages not ready (503)."""
    if isinstance(error, RequestFailedError) and error.reason.startswith("ValueError"):
        return openai_error(400, "invalid_request", error.reason, param=param)
    if isinstance(error, PipelineBusyError):
        return openai_error(429, "too_many_requests", str(error), kind="rate_limit_error",
                            **{"Retry-After": str(BUSY_RETRY_S)})
    if isinstance(error, RequestFailedError):
        log.error("model request failed: %r", error)
        return openai_error(500, "model_error", f"the model failed: {error}",
                            kind="server_error")
    return openai_error(503, "not_ready", str(error), kind="server_error",
                        **{"Retry-After": str(NOT_READY_RETRY_S)})
