"""The official `openai` SDK's clients (sync and async) for a server under test."""

from __future__ import annotations

from typing import Any

import openai
from openai.resources.realtime.realtime import AsyncRealtimeConnection

from tests.served import Served


def clients(served: Served) -> tuple[openai.OpenAI, openai.AsyncOpenAI]:
    """Sync (call it through asyncio.to_thread: the server runs on the test's loop) and async.
    No API keys on the server (local mode); the SDK insists on one, and sends it."""
    options: dict[str, Any] = {"base_url": f"{served.url}/v1", "api_key": "local-mode",
                               "max_retries": 0}
    return openai.OpenAI(**options), openai.AsyncOpenAI(**options)


async def until(conn: AsyncRealtimeConnection, event_type: str, seen: list[Any]) -> Any:
    """Read events (noted in `seen`) up to the first of `event_type`; an error event fails."""
    async for event in conn:
        seen.append(event)
        assert event.type != "error", event
        if event.type == event_type:
            return event
    raise AssertionError(f"the connection closed before {event_type}")
