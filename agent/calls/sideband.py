"""OpenAI's sideband on a call: `GET /v1/realtime?call_id=...` (API keys only) lets a backend
watch and steer a call that runs elsewhere (a browser's WebRTC call, a SIP bridge's call without
a data channel): it receives every server event of the call from the moment it joins, starting
with the session as it stands, and its client events are handled as if they came on the call's
data channel, under the same rate limit. The call ends the sideband; the sideband never ends
the call."""

from __future__ import annotations

import asyncio
import contextlib
import json

from starlette.websockets import WebSocket

from agent.calls.call_base import CallBase
from agent.calls.event_socket import EventSocket
from agent.realtime.server_events import session_created


class Sideband:
    """One observer/controller socket on one call."""

    def __init__(self, call: CallBase, socket: WebSocket) -> None:
        self.call = call
        self.socket = socket
        self.events = EventSocket(socket, call.settings.ws_send_buffer_bytes)
        self._done = asyncio.Event()

    def send(self, text: str) -> bool:
        """A server event of the call; False when this observer is over its bound."""
        return self.events.send(text)

    async def close(self, code: int) -> None:
        await self.events.close(code)
        self._done.set()

    async def run(self) -> None:
        """Observe the call until either the socket or the call ends."""
        self.events.send_anyway(json.dumps(session_created(self.call.session_object())))
        self.call.observers.add(self)
        tasks = [asyncio.ensure_future(self.events.run()), asyncio.ensure_future(self._read())]
        try:
            await self._done.wait()
        finally:
            self.call.observers.discard(self)
            for task in tasks:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _read(self) -> None:
        while True:
            message = await self.socket.receive()
            if message["type"] == "websocket.disconnect":
                break
            self.call.on_message(message.get("text") or message.get("bytes") or b"")
        self._done.set()
