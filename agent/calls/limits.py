"""Per-call limits on what a caller may send: a token bucket for data-channel messages.

A caller that sends faster than the bucket refills has its excess messages dropped unread, so a
flood costs the server a counter increment per message and never a queue entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any


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

    def take(self) -> bool:
        """Spend one token: True if there was one, False if the caller is over the rate."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


# The limits (and the inbound jitter buffer) an operator can set from the environment
# (`omnivox serve`), by variable name.
ENV_LIMITS = {
    "OMNIVOX_MAX_CALLS": "max_calls",
    "OMNIVOX_MAX_CALL_S": "max_call_s",
    "OMNIVOX_IDLE_TIMEOUT_S": "idle_timeout_s",
    "OMNIVOX_MAX_SDP_BYTES": "max_sdp_bytes",
    "OMNIVOX_MAX_EVENT_BYTES": "max_event_bytes",
    "OMNIVOX_MAX_EVENTS_PER_S": "max_events_per_s",
    "OMNIVOX_MAX_EVENT_BURST": "max_event_burst",
    "OMNIVOX_INBOUND_JITTER_PACKETS": "inbound_jitter_packets",
}
ENV_MAX_UTTERANCE = "OMNIVOX_MAX_UTTERANCE_MS"


def env_limits(environ: Mapping[str, str]) -> dict[str, Any]:
    """The limits given in the environment, as Settings fields (Settings parses and checks)."""
    limits: dict[str, Any] = {
        field: environ[name] for name, field in ENV_LIMITS.items() if environ.get(name, "").strip()
    }
    if environ.get(ENV_MAX_UTTERANCE, "").strip():
        limits["vad"] = {"max_utterance_ms": environ[ENV_MAX_UTTERANCE]}
    return limits
