"""A server that requires API keys (tests/test_auth.py, tests/test_client_secrets.py): its keys,
its allowed origin, and requests, offers and refusals made against it."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from aiortc import RTCSessionDescription

from agent.config import Settings
from tests.media_servers import tone_server
from tests.rtc_client import ArrayAudioTrack, RtcCaller
from tests.served import Served

# Fresh per run, so finding one in a log can only mean it was logged.
KEY = "sk-test-" + secrets.token_hex(16)
OTHER_KEY = "sk-other-" + secrets.token_hex(16)
ALLOWED_ORIGIN = "https://app.example"
CALL_TIMEOUT_S = 20.0


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def keyed_tone_server(data_dir: Path) -> AsyncIterator[Served]:
    """A media-only server (tone replies) that requires API keys and allows one CORS origin."""
    settings = Settings(
        data_dir=data_dir,
        max_calls=6,
        api_keys=f"{KEY}, {OTHER_KEY}",
        cors_origins=[ALLOWED_ORIGIN],
        max_client_secrets=64,
    )
    async with tone_server(settings) as served:
        yield served


async def request(served: Served, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=served.url, timeout=CALL_TIMEOUT_S) as http:
        return await http.request(method, path, **kwargs)


async def mint(served: Served, token: str = KEY, **body: Any) -> httpx.Response:
    return await request(served, "POST", "/v1/realtime/client_secrets", json=body or None,
                         headers=bearer(token))


async def offer_call(
    served: Served, token: str | None, pcm: np.ndarray | None = None
) -> tuple[RtcCaller, httpx.Response]:
    """A real aiortc caller whose offer is posted with `token` as Bearer (none when None); on
    201 the answer is applied, so the call connects. Close the caller when done."""
    caller = RtcCaller(served.url, ArrayAudioTrack(pcm if pcm is not None else np.zeros(0)))
    caller.pc.addTransceiver(caller.audio, direction="sendrecv")
    await caller.pc.setLocalDescription(await caller.pc.createOffer())
    reply = await request(
        served, "POST", "/v1/realtime/calls", content=caller.pc.localDescription.sdp,
        headers={"Content-Type": "application/sdp", **(bearer(token) if token else {})},
    )
    if reply.status_code == 201:
        caller.location = reply.headers["location"]
        await caller.pc.setRemoteDescription(RTCSessionDescription(reply.text, "answer"))
    return caller, reply


def assert_refused(reply: httpx.Response, code: str) -> None:
    assert reply.status_code == 401, (reply.status_code, reply.text)
    assert reply.headers["www-authenticate"].startswith("Bearer"), reply.headers
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == code, error
    assert error["message"]
