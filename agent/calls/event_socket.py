"""Server events written to one WebSocket, in order, from a bounded queue: a client that lets
`limit_bytes` of events wait unread (its socket full: it is not reading) is over its bound,
which the owner hears of at once instead of the queue growing."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

from starlette.websockets import WebSocket

CLOSE_WAIT_S = 2.0  # for the close frame to go out to a client that may not be reading
DRAIN_POLL_S = 0.02


class EventSocket:
    """The writing half of one Realtime WebSocket."""

    def __init__(self, socket: WebSocket, limit_bytes: int) -> None:
        self.socket = socket
        self.limit_bytes = limit_bytes
        self._out: deque[str] = deque()
        self._bytes = 0
        self._wake = asyncio.Event()

    @property
    def waiting_bytes(self) -> int:
        """The events queued and not yet written (what the bound holds)."""
        return self._bytes

    def send(self, text: str) -> bool:
        """Queue `text`; False (and nothing queued) when that would pass the bound."""
        if self._bytes + len(text) > self.limit_bytes:
            return False
        self.send_anyway(text)
        return True

    def send_anyway(self, text: str) -> None:
        """Queue `text` past the bound (a last event, before the socket is closed)."""
        self._out.append(text)
        self._bytes += len(text)
        self._wake.set()

    def clear(self) -> None:
        self._out.clear()
        self._bytes = 0

    async def run(self) -> None:
        """Write the queued events as the client takes them (uvicorn waits while it does not)."""
        while True:
            while not self._out:
                self._wake.clear()
                await self._wake.wait()
            text = self._out.popleft()
            self._bytes -= len(text)
            await self.socket.send_text(text)

    async def drain(self, timeout_s: float) -> None:
        """Wait (bounded) until every queued event has been written."""
        deadline = time.monotonic() + timeout_s
        while self._out and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)

    async def close(self, code: int) -> None:
        """Close the socket; a client that does not read may never take the close frame, so the
        wait is bounded (uvicorn drops the connection once the route returns)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.socket.close(code), CLOSE_WAIT_S)
