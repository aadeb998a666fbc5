"""The fault tests' server: one for the whole package (one engine set, reused by every test of
its modules), its restart back-off short."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.app import create_app
from agent.config import ConversationSettings, Settings
from agent.profiles import build_pipeline
from pipeline.model_version import ModelVersion
from pipeline.models import ensure_models
from pipeline.settings import STAGE_ORDER
from tests.conftest import wait_ready
from tests.faults.fault_server import REPLY_TOKENS, RESTART, FaultServer
from tests.served import serve


@pytest.fixture(scope="package")
async def fault_server(tiny_models_dir: Path, tmp_path_factory: pytest.TempPathFactory
                       ) -> AsyncIterator[FaultServer]:
    """The real product on the tiny family, this package's own. Its models dir links each part
    of the shared build, so a test can take one part away (a bad model path) without touching
    the build the other modules use."""
    await ensure_models("tiny", ModelVersion(tiny_models_dir))
    models_dir = tmp_path_factory.mktemp("fault-models")
    (models_dir / "tiny").mkdir()
    for part in STAGE_ORDER:
        (models_dir / "tiny" / part).symlink_to(tiny_models_dir / "tiny" / part)
    settings = Settings(
        profile="tiny",
        models_dir=models_dir,
        data_dir=tmp_path_factory.mktemp("fault-data"),
        max_calls=8,
        conversation=ConversationSettings(max_reply_tokens=REPLY_TOKENS),
    )
    pipeline = build_pipeline(settings, {"restart": RESTART, "build_models": False})
    app = create_app(settings, pipeline=pipeline)
    async with serve(app) as served:
        await wait_ready(served)
        yield FaultServer(served, models_dir)
