"""A model-serving request's JSON body read into its pydantic model, or refused naming the field.

What the server cannot honour is refused (400 naming the field), never dropped: the models
forbid fields they do not know.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from agent.calls.signalling import read_body
from agent.openai_errors import openai_error

M = TypeVar("M", bound=BaseModel)

NOT_HONOURED = "not supported by this server (refused rather than ignored)"
# Pydantic names the member of a union it tried in the error's location; a client never sees
# those, only field names and list indexes.
_UNION_MEMBERS = {"str", "none"}


class BadRequest(ValueError):  # a ValueError: pydantic reports it raised in a validator
    """A request refused: `param` is the field at fault (OpenAI's `param`)."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


async def read_request(request: Request, model: type[M], max_bytes: int) -> M | JSONResponse:
    """The request's body as `model`, or the refusal to answer with: 413 past `max_bytes`
    (never read unbounded), 400 naming the field at fault."""
    body = await read_body(request, max_bytes)
    if body is None:
        return openai_error(413, "request_too_large", f"the request body exceeds {max_bytes} bytes")
    try:
        return parse_body(model, body)
    except BadRequest as exc:
        return openai_error(400, "invalid_request", str(exc), param=exc.param)


def parse_body(model: type[M], body: bytes | dict[str, Any]) -> M:
    """The request (a JSON body, or a form's fields), or BadRequest naming the first field at
    fault."""
    try:
        if isinstance(body, dict):
            return model.model_validate(body)
        return model.model_validate_json(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, BadRequest):  # a check across fields names its own field
            raise BadRequest(f"{cause.param}: {cause}", cause.param) from None
        param = field_path(error["loc"])
        where = f"{param}: " if param else ""
        message = NOT_HONOURED if error["type"] == "extra_forbidden" else error["msg"]
        raise BadRequest(f"{where}{message}", param or None) from None


def field_path(loc: tuple[int | str, ...]) -> str:
    """`messages[0].content` from pydantic's ('messages', 0, 'content', 'str')."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not (part in _UNION_MEMBERS or "[" in part or part[:1].isupper()):
            path += f".{part}" if path else part
    return path
