"""Shared fixtures: speech made with espeak-ng, and a served app with a test responder."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.app import create_app
from agent.config import Settings
from tests.responder import ToneResponder
from tests.served import Served, serve

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def media_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Settings for a media-only server (no model pipeline)."""
    return Settings(data_dir=tmp_path_factory.mktemp("data"), max_calls=8)


@pytest.fixture(scope="session")
async def media_server(media_settings: Settings) -> AsyncIterator[Served]:
    """A media-only server whose calls answer every utterance with a tone."""
    responders: list[ToneResponder] = []

    def factory(call):
        responder = ToneResponder(call)
        responders.append(responder)
        return responder

    app = create_app(media_settings, handler_factory=factory)
    app.state.test_responders = responders
    async with serve(app) as served:
        yield served
