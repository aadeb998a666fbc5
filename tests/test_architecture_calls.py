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
being generated cancels every request of the turn in every engine. Whisper beside the Thinker
writes down what the caller said (input transcription, history, call record), and a tool is
called from a spoken question and its result spoken."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from agent.app import create_app
from agent.config import ConversationSettings, Settings
from agent.profiles import build_pipeline, load_profiles
from pipeline.families.kit.build_support import read_manifest
from pipeline.families.kit.release_build import release_dir
from pipeline.families.orpheus import build_orpheus
from pipeline.families.orpheus.release import SNAC, TALKER, THINKER
from pipeline.families.qwen3_omni.build import SEED as QWEN3_OMNI_SEED
from pipeline.families.qwen3_omni.release import write_tiny_release as write_qwen3_omni_release
from pipeline.families.qwen25_omni.build import SEED
from pipeline.families.qwen25_omni.release import write_tiny_release
from tests.audio_fixtures import speech_wav
from tests.conftest import wait_ready
from tests.metrics_samples import grew, scrape
from tests.openai_clients import clients
from tests.product_calls import (
    barge_in_on_a_second_reply,
    call_id_of,
    connect,
    get_record,
    loud_ms,
    record_turns,
    session_of,
    spoken,
    update_session,
    wait_until,
)
from tests.served import Served, serve

pytestmark = pytest.mark.engines

ENDS = "omnivox_semantic_turn_ends_total"


def tiny_checkpoint(profile: str, folder: Path) -> Path:
    """A checkpoint directory of the real layout, holding tiny random weights."""
    if profile == "omni":
        write_tiny_release(folder / "release", SEED)
        return folder / "release"
    if profile == "qwen3-omni":
        write_qwen3_omni_release(folder / "release", QWEN3_OMNI_SEED)
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


@pytest.fixture(scope="module", params=["omni", "orpheus", "qwen3-omni"])
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
        # Whisper beside the Thinker wrote down the question: the Realtime event, the history
        # and the call record have it.
        (heard,) = caller.of_type("conversation.item.input_audio_transcription.completed")
        assert {"capital", "france"} <= set(heard["transcript"].lower().strip("?.").split())
        item = session_of(served, caller).conversation.get(heard["item_id"])
        assert item is not None and item.text == heard["transcript"]
        record = (await get_record(served.url, call_id_of(caller))).json()
        assert record["turns"][0]["user_transcript"] == heard["transcript"]

        await barge_in_on_a_second_reply(served, caller, question, timeout_s=180)
    finally:
        await caller.hang_up()


WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                          "unit": {"enum": ["C", "F"]}}}


async def test_a_spoken_question_calls_a_tool_whose_result_is_spoken(
    served: Served, question: np.ndarray
) -> None:
    """Function calling on the real architectures: the Thinker hears the question, answers it
    under the tool's grammar (random weights: `required` makes it a call), and after the
    client's output speaks a reply written knowing the result."""
    caller = await connect(served.url)
    turns = record_turns(session_of(served, caller))
    try:
        update_session(caller, tools=[{"type": "function", "name": "get_weather",
                                       "parameters": WEATHER}],
                       tool_choice="required", max_output_tokens=200)
        await caller.wait_for("session.updated", timeout=10)
        caller.audio.replace(question)
        done = (await caller.wait_for("response.done", timeout=180))["response"]
        assert done["status"] == "completed", done
        (call,) = done["output"]
        assert (call["type"], call["name"]) == ("function_call", "get_weather"), call
        jsonschema.validate(json.loads(call["arguments"]), WEATHER)
        assert turns[0].audio is not None and turns[0].response_format is not None
        assert not caller.of_type("output_audio_buffer.started"), "a call is not spoken"

        caller.send({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": call["call_id"], "output": '{"temp": 21}'}})
        await wait_until(lambda: any(i.get("type") == "function_call_output" for _, e in
                                     caller.events if (i := e.get("item") or {})),
                         10, "the function's output to join the conversation")
        update_session(caller, max_output_tokens=16)
        await caller.wait_for("session.updated", count=2, timeout=10)
        caller.send({"type": "response.create", "response": {"tool_choice": "none"}})
        spoken = (await caller.wait_for("response.done", count=2, timeout=180))["response"]
        assert spoken["status"] == "completed", spoken
        assert spoken["output"][0]["type"] == "message"
        await wait_until(lambda: loud_ms(caller) > 0, 60, "the caller to hear the reply")
        assert {"role": "tool", "content": '{"temp": 21}'} in turns[1].messages
        assert turns[1].speak and turns[1].response_format is None
    finally:
        await caller.hang_up()


async def test_semantic_vad_judges_the_callers_words(served: Served,
                                                     question: np.ndarray) -> None:
    """`semantic_vad` on a Thinker that hears audio: at the caller's pause its own LM scores
    the recogniser's words (random weights: the judgement may go either way), and the turn is
    answered."""
    before = await scrape(served.url)
    caller = await connect(served.url)
    try:
        update_session(caller, max_output_tokens=24, audio={"input": {"turn_detection": {
            "type": "semantic_vad", "eagerness": "high"}}})
        await caller.wait_for("session.updated", timeout=10)
        call = session_of(served, caller).call
        # Only the judgement ends the turn before 10 s (the longest silence allowed): on two
        # busy cores the recogniser beside the Thinker took up to 5 s to hear the words, longer
        # than any eagerness's silence, which then ended the turn unjudged.
        call.vad.reconfigure(dataclasses.replace(call.vad.config, silence_ms=10_000))
        caller.audio.replace(question)
        judged = 0.0
        while not judged and not caller.of_type("input_audio_buffer.speech_stopped"):
            await asyncio.sleep(0.2)
            after = await scrape(served.url)
            judged = sum(grew(before, after, ENDS, decision=d) for d in ("ended", "waited"))
        assert judged >= 1, "the words were scored at the pause"
        if grew(before, after, ENDS, decision="waited"):
            assert call.end_utterance(), "the caller is still in the pause that was judged"
        done = (await caller.wait_for("response.done", timeout=180))["response"]
        assert done["status"] == "completed", done
        (heard,) = caller.of_type("conversation.item.input_audio_transcription.completed")
        assert "france" in heard["transcript"].lower(), heard
    finally:
        await caller.hang_up()


async def test_an_uploaded_question_is_transcribed(served: Served,
                                                   tmp_path: Path) -> None:
    """`/v1/audio/transcriptions` through the `openai` SDK: the recogniser beside the Thinker
    writes the file's words down."""
    wav = speech_wav("What is the capital of France?", tmp_path / "q.wav", rate=16_000,
                     pad_before_s=0.3, pad_after_s=0.3)
    _, client = clients(served)
    (model,) = (await client.models.list()).data
    text = await client.audio.transcriptions.create(model=model.id, response_format="text",
                                                    file=("q.wav", wav.read_bytes()))
    assert {"capital", "france"} <= set(str(text).lower().strip(" ?.\n").split()), text
