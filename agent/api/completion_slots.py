"""A bound on chat completion requests in flight per engine.

Completions share each engine with the calls' turns (continuous batching): without a bound, a
burst of them would fill the batch and the calls' next turns would wait behind it. Beyond
`max_completions_in_flight` a request is refused at once (429 with Retry-After) instead of
queued.
"""

from __future__ import annotations

from collections import Counter

from fastapi.responses import JSONResponse

from agent.openai_errors import BUSY_RETRY_S, openai_error


class CompletionSlots:
    """Requests in flight per engine (a stage name: the Thinker serves completions)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: Counter[str] = Counter()

    def take(self, engine: str) -> bool:
        """Hold a slot of `engine`; False when all are held (refuse the request)."""
        if self._held[engine] >= self.limit:
            return False
        self._held[engine] += 1
        return True

    def give_back(self, engine: str) -> None:
        self._held[engine] -= 1

    def held(self, engine: str) -> int:
        return self._held[engine]

    def busy(self, engine: str) -> JSONResponse:
        """The 429 for a request beyond the bound (take() said no)."""
        return openai_error(429, "too_many_requests", f"{self.limit} requests are already in "
                            f"flight on the {engine}'s engine; retry shortly",
                            kind="rate_limit_error", **{"Retry-After": str(BUSY_RETRY_S)})
