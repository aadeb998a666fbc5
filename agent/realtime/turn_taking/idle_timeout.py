"""`turn_detection.idle_timeout_ms` (server_vad): when the caller stays silent that long after
the agent's last reply finished playing, the server says so (`input_audio_buffer.
timeout_triggered`) and answers anyway, prompting the caller to go on, as OpenAI does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class IdleTimeout:
    """One call's idle timer: armed when the agent falls silent with nothing to answer,
    disarmed when the caller speaks, a reply starts or the session changes."""

    def __init__(self, fire: Callable[[int], None]) -> None:
        self._fire = fire  # called with the silence's length in ms
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, idle_ms: int | None) -> None:
        """Start the wait (again) for `idle_ms` of silence; None: no timeout."""
        self.disarm()
        if idle_ms is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(idle_ms / 1000, self._expired, idle_ms)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def armed(self) -> bool:
        return self._timer is not None

    def _expired(self, idle_ms: int) -> None:
        self._timer = None
        self._fire(idle_ms)
