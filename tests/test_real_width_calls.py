"""Calls on the real models' WIDTHS, served as real weights are: `omni`, `orpheus` and
`qwen3-omni` with `--model-path` on checkpoints that `omnivox models build ... --real-widths`
writes (every width of Qwen2.5-Omni-7B, Orpheus 3B and Qwen3-Omni-30B-A3B, one layer a stack,
RANDOM weights, the published layout and config names), on the CPU (`--device cpu`).

Tiny checkpoints prove code paths, not sizes: here a Qwen2.5-Omni Thinker row is 3584 floats
(a pool block of 1 MiB holds 73), its talker has 12 heads of 128 in an 896 width; Qwen3-Omni's
thinker routes among 128 experts 2048 wide, its talker's rows are 1024 wide and its code
predictor and code2wav run at their published widths; the vocabularies are the real ones. A
caller utterance of over 8 s is answered with audio of at least 150 Talker codes, and talking
over the next reply cancels every request of the turn in every engine.

About 3.5 to 3.9 GB of checkpoint and two to three minutes a family on a 2-core machine: it
runs in `make soak` (OMNIVOX_REAL_WIDTHS=1); `make test` keeps the real-width conversion parity
(tests/test_qwen25_omni_conversion.py) and the block-splitting of rows (tests/test_shm.py).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.app import create_app
from agent.config import ConversationSettings, Settings
from agent.profiles import build_pipeline, load_profiles
from pipeline.families.orpheus.real_size import write_real_width_checkpoint
from pipeline.families.qwen3_omni.real_widths import (
    write_real_width_release as write_qwen3_omni_release,
)
from pipeline.families.qwen25_omni.real_widths import write_real_width_release
from tests.conftest import wait_ready
from tests.product_calls import (
    barge_in_on_a_second_reply,
    connect,
    loud_ms,
    spoken,
    wait_until,
)
from tests.served import Served, serve

pytestmark = [pytest.mark.engines, pytest.mark.skipif(
    os.environ.get("OMNIVOX_REAL_WIDTHS") != "1",
    reason="a soak (make soak): 3.9 GB of checkpoint and minutes a family; make test runs the "
           "real-width conversion parity and the row splitting instead")]

QUESTION = ("Hello there. I am calling about the train timetable for tomorrow morning. "
            "Could you tell me when the first train to the capital leaves, and whether I need "
            "to book a seat in advance?")
MIN_UTTERANCE_S, MIN_CODES = 8.0, 150
# 150 Talker codes as audio: Qwen2.5-Omni's codec speaks 50 codes a second; Orpheus's 7-code
# SNAC frame is 2048 samples at 24 kHz; Qwen3-Omni's 16-code frame is 80 ms (less the 555
# samples its code2wav holds back). (Orpheus's usage counts the tokens of its decode windows,
# context frames included, so its codes are judged by the audio they make.)
MIN_AUDIO_MS = {"omni": MIN_CODES * 1000 // 50, "orpheus": MIN_CODES * 2048 * 1000 // 7 // 24000,
                "qwen3-omni": (MIN_CODES // 16) * 80 - 555 * 1000 // 24000}
SAMPLE_RATE = 48000


@pytest.fixture(scope="module")
def omni_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_real_width_release(tmp_path_factory.mktemp("omni-real-widths") / "release")


def checkpoint(request: pytest.FixtureRequest, folder: Path) -> Path:
    """The profile's real-width checkpoint (Qwen2.5-Omni's written once for the module: it is
    also Orpheus's Thinker)."""
    if request.param == "qwen3-omni":
        return write_qwen3_omni_release(folder / "release")
    omni: Path = request.getfixturevalue("omni_release")
    if request.param == "omni":
        return omni
    return write_real_width_checkpoint(folder / "orpheus", thinker=omni)


def cpu_settings(profile: str) -> dict[str, Any]:
    """The tiny profile's settings for random weights, the engines and the Thinker's torch
    copy in bfloat16 (half the memory of float32 on the CPU), long enough replies, and the
    Thinker writing words of its (tiny) tokenizer, not ids of the real vocabulary."""
    tiny = copy.deepcopy(load_profiles()[f"{profile}-tiny"])
    stages = tiny.setdefault("stages", {})
    for stage in ("thinker", "talker"):
        engine = stages.setdefault(stage, {}).setdefault("engine", {})
        engine["dtype"] = "bfloat16"
    stages["thinker"] |= {"states_dtype": "bfloat16", "tokenizer_ids_only": True}
    if profile == "omni":
        stages["talker"]["max_codes"] = 200
    elif profile == "qwen3-omni":
        stages["talker"]["max_frames"] = 16  # 256 codes
    else:  # random audio ids: about 1 in 7 fits its frame position, so ~12 frames a chunk
        stages["talker"]["max_tokens"] = 600
    # On 2 shared cores a real-width Orpheus Talker samples about 10 ids a second, and a
    # window of 2 frames takes about 100 of them: more than the 30 s a silent request gets.
    return {"stall_timeout_s": 120.0,
            **{key: tiny[key] for key in ("stages", "cascade") if key in tiny}}


@pytest.fixture(scope="module", params=["omni", "orpheus", "qwen3-omni"])
async def served(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    folder = tmp_path_factory.mktemp(request.param)
    settings = Settings(profile=request.param, device="cpu", models_dir=folder / "models",
                        model_path=checkpoint(request, folder),
                        data_dir=folder / "data", max_calls=2,
                        conversation=ConversationSettings(max_reply_tokens=24))
    app = create_app(settings, pipeline=build_pipeline(settings, cpu_settings(request.param)))
    async with serve(app) as served:
        await wait_ready(served, timeout_s=900)
        yield served


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    pcm = spoken(QUESTION, tmp_path_factory.mktemp("speech"))
    assert len(pcm) / SAMPLE_RATE > MIN_UTTERANCE_S + 0.7  # the speech, its silences apart
    return pcm


async def test_a_long_question_is_answered_and_barge_in_cuts_the_next(
        served: Served, question: np.ndarray) -> None:
    started = time.monotonic()
    caller = await connect(served.url, question)
    try:
        first = await caller.wait_for("response.done", timeout=600)
        assert first["response"]["status"] == "completed", first
        usage = first["response"]["usage"]["output_token_details"]
        assert usage["audio_tokens"] >= MIN_CODES, usage
        least = MIN_AUDIO_MS[served.app.state.settings.profile]
        await wait_until(lambda: loud_ms(caller) >= least, 120,
                         f"the caller to hear {least} ms of the reply")
        print(f"\nreal widths: {len(question) / SAMPLE_RATE:.1f} s asked, reply done after "
              f"{time.monotonic() - started:.0f} s: {usage}, {loud_ms(caller)} ms heard so far")

        await barge_in_on_a_second_reply(served, caller, question, timeout_s=600)
    finally:
        await caller.hang_up()
