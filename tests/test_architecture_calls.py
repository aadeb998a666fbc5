"""The real model architectures hold a real WebRTC call, like any profile, served the way real
weights are: the `omni` and `orpheus` profiles reading a checkpoint directory (`model_path`)
where it lies. Weights cannot be downloaded here, so the checkpoints are the tiny random ones
laid out as the real releases are, and the stages run with their tiny profiles' settings for
random weights (a fixed reply length, audio ids only).

- `omni`: Qwen2.5-Omni (transformers' classes at test size) hears the caller's audio directly
  in its Thinker, its converted Talker speaks on vLLM from the Thinker's hidden states, and
  token2wav renders windows as codes arrive.
- `orpheus`: Qwen2.5-Omni's thinker (the checkpoint's thinker/, a tiny release) hears the
  caller, an Orpheus Llama Talker on vLLM (Orpheus's real ids) speaks its text, and SNAC
  decodes its 7-token frames in windows.

Random weights: the audio is noise. The caller hears the reply, and talking over a reply still
being generated cancels every request of the turn in every engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.app import create_app
from agent.config import ConversationSettings, Settings
from agent.profiles import build_pipeline, load_profiles
from pipeline.families.build_support import read_manifest
from pipeline.families.orpheus import build_orpheus
from pipeline.families.orpheus.release import SNAC, TALKER, THINKER
from pipeline.families.qwen25_omni.build import SEED, release_dir
from pipeline.families.qwen25_omni.release import write_tiny_release
from tests.conftest import wait_ready
from tests.product_calls import (
    barge_in_on_a_second_reply,
    connect,
    loud_ms,
    spoken,
    wait_until,
)
from tests.served import Served, serve

pytestmark = pytest.mark.engines


def tiny_checkpoint(profile: str, folder: Path) -> Path:
    """A checkpoint directory of the real layout, holding tiny random weights."""
    if profile == "omni":
        write_tiny_release(folder / "release", SEED)
        return folder / "release"
    built = build_orpheus(folder / "built", progress=False)
    (folder / "release").mkdir()
    for part in (TALKER, SNAC):
        (folder / "release" / part).symlink_to(built / part)
    (folder / "release" / THINKER).symlink_to(release_dir(built.parent / "qwen25_omni"))
    return folder / "release"


def random_weight_settings(profile: str) -> dict[str, Any]:
    """The tiny profile's stage and cascade settings (what random weights need)."""
    tiny = load_profiles()[f"{profile}-tiny"]
    return {key: tiny[key] for key in ("stages", "cascade") if key in tiny}


@pytest.fixture(scope="module", params=["omni", "orpheus"])
async def served(request: pytest.FixtureRequest, tiny_models_dir: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    checkpoint = tiny_checkpoint(request.param, tmp_path_factory.mktemp("checkpoint"))
    settings = Settings(profile=request.param, device="cpu", models_dir=tiny_models_dir,
                        model_path=checkpoint,
                        data_dir=tmp_path_factory.mktemp("data"), max_calls=2,
                        conversation=ConversationSettings(max_reply_tokens=24))
    pipeline = build_pipeline(settings, random_weight_settings(request.param))
    assert pipeline.settings.model_path == checkpoint.resolve()
    app = create_app(settings, pipeline=pipeline)
    async with serve(app) as served:
        await wait_ready(served)
        yield served


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return spoken("What is the capital of France?", tmp_path_factory.mktemp("speech"))


async def test_the_caller_hears_the_reply_and_barge_in_cuts_it(served: Served,
                                                               question: np.ndarray) -> None:
    pipeline = served.app.state.pipeline.settings  # its parts derived from the checkpoint
    built = read_manifest(Path(pipeline.models_dir) / pipeline.family)
    assert built["release"] == str(pipeline.model_path) and built["seed"] is None
    if pipeline.family == "orpheus":  # its Thinker: qwen25_omni's, from the thinker/ release
        thinker = read_manifest(Path(pipeline.models_dir) / "qwen25_omni")
        assert thinker["release"] == str((pipeline.model_path / THINKER).resolve())
    caller = await connect(served.url, question)
    try:
        first = await caller.wait_for("response.done", timeout=180)
        assert first["response"]["status"] == "completed", first
        usage = first["response"]["usage"]["output_token_details"]
        assert usage["text_tokens"] == 24 and usage["audio_tokens"] > 0
        await wait_until(lambda: loud_ms(caller) > 0, 60, "the caller to hear the reply")

        await barge_in_on_a_second_reply(served, caller, question, timeout_s=180)
    finally:
        await caller.hang_up()
