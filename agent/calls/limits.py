"""Per-call limits on what a caller may send: a token bucket for data-channel messages.

A caller that sends faster than the bucket refills has its excess messages dropped unread, so a
flood costs the server a counter increment per message and never a queue entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """`rate` tokens a second up to `burst` saved; `take()` spends one if there is one."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1, got {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self, amount: float = 1.0) -> bool:
        """Spend `amount` tokens: True if there were that many, False if the caller is over
        the rate (and nothing is spent)."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < amount:
            return False
        self._tokens -= amount
        return True
