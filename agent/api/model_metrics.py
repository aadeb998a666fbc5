"""Metrics of the model-serving routes: each answer counted by endpoint and status, and timed
from the request's arrival to the answer's start (the routes await the first output before
answering, so for a streamed answer this is its time to first output)."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable

from fastapi import Request, Response

Handler = Callable[[Request], Awaitable[Response]]


def measured(endpoint: str) -> Callable[[Handler], Handler]:
    """Count and time a route's answers as `endpoint`."""
    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def answer(request: Request) -> Response:
            started = time.monotonic()
            response = await handler(request)
            request.app.state.metrics.model_request(endpoint, response.status_code,
                                                    time.monotonic() - started)
            return response
        return answer
    return wrap
