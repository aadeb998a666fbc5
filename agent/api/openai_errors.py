"""Errors in OpenAI's JSON shape for the model-serving routes: `message`, `type`, `param` (the
request field at fault, or null) and `code`, under `error`, as the `openai` SDK reads them."""

from __future__ import annotations

from fastapi.responses import JSONResponse


def openai_error(status: int, code: str, message: str, *, param: str | None = None,
                 kind: str = "invalid_request_error", **headers: str) -> JSONResponse:
    """The response a refused model request gets; `headers` such as Retry-After go with it."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers or None)


def model_not_found(model: str) -> JSONResponse:
    """404 for a model id (`name` or `name@version`) this server does not serve."""
    return openai_error(404, "model_not_found", f"The model {model!r} does not exist on this "
                        "server (GET /v1/models lists the ones it serves)", param="model")
