"""The qwen3_omni VoiceBox: the talker's frames to PCM by code2wav, streamed per turn and
batched across calls, against the reference's decode of each turn's frames at once.

On the tiny release's code2wav (transformers' `Qwen3OmniMoeCode2Wav`, RANDOM weights from the
build's fixed seed), float32, CPU, one torch thread. The stage is started on a models directory
holding the family's tiny release and manifest only (code2wav needs nothing else), with its
default settings but a batch window long enough for jobs sent together to join one batch.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen3OmniMoeCode2Wav, Qwen3OmniMoeForConditionalGeneration

from pipeline.families.kit.build_support import write_manifest
from pipeline.families.kit.release_build import TINY_RELEASE, release_fields
from pipeline.families.qwen3_omni.build import FAMILY, RECIPE, SEED
from pipeline.families.qwen3_omni.release import write_tiny_release
from pipeline.families.qwen3_omni.voicebox import Qwen3OmniVoiceBox
from pipeline.stage import VoiceBoxJob
from pipeline.tensors.shm import BlockPool
from tests.stage_fixtures import pool_fixture, print_figure, stage_fixture
from tests.stage_outputs import voiced_pcm

CODEBOOKS = 16  # codes a frame
CODEBOOK_SIZE = 128  # the tiny release's
SAMPLES_PER_FRAME = 1920
HELD_BACK = 555  # the reference's right trims: a turn's first job voices 1920 n - 555
TOLERANCE = 1e-5  # max |stage - reference| sample difference; measured 4.2e-7 (float rounding)


@pytest.fixture(scope="module")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models directory whose qwen3_omni family holds its tiny release (what the build
    writes from SEED) and a manifest naming it: where the stage finds its release by default."""
    models = tmp_path_factory.mktemp("models")
    family = models / FAMILY
    write_tiny_release(family / TINY_RELEASE, SEED)
    write_manifest(family, release_fields(FAMILY, RECIPE, SEED, None))
    return models


@pytest.fixture(scope="module")
def reference(family_models: Path) -> Qwen3OmniMoeCode2Wav:
    """The release's code2wav as transformers loads it."""
    torch.set_num_threads(1)
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        family_models / FAMILY / TINY_RELEASE)
    code2wav: Qwen3OmniMoeCode2Wav = model.code2wav.eval()
    return code2wav


def turn_codes(frames: int, seed: int) -> torch.Tensor:
    """A turn's frames, (codebooks, frames), random codes from `seed`."""
    return torch.randint(0, CODEBOOK_SIZE, (CODEBOOKS, frames),
                         generator=torch.Generator().manual_seed(seed))


def decoded(reference: Qwen3OmniMoeCode2Wav, codes: torch.Tensor) -> np.ndarray:
    """The reference's decode of all of `codes` at once (1-D)."""
    with torch.inference_mode():
        wave: np.ndarray = reference(codes[None]).reshape(-1).numpy()
    return wave


def flat(codes: torch.Tensor) -> list[int]:
    """Frames as a job carries them: frame 0's 16 codes (codebook 0 first), then frame 1's..."""
    tokens: list[int] = codes.T.reshape(-1).tolist()
    return tokens


def group_jobs(turn: str, codes: torch.Tensor, groups: list[int]) -> list[VoiceBoxJob]:
    """A turn's jobs as the cascade sends them: a job a group of frames, each saying more of
    the turn follows, then the closing job (no tokens, more=False)."""
    bounds = np.cumsum([0, *groups])
    jobs = [VoiceBoxJob(f"{turn}/voicebox/0.{index}", flat(codes[:, start:end]), more=True)
            for index, (start, end) in enumerate(itertools.pairwise(bounds))]
    return [*jobs, VoiceBoxJob(f"{turn}/voicebox/end", [])]


pool = pool_fixture("omnivox-qwen3-omni-voicebox-test", block_count=16, block_size=1 << 20)
voicebox = stage_fixture(Qwen3OmniVoiceBox, {"batch_window_s": 0.05}, "qwen3-omni-voicebox")
two_turns = stage_fixture(Qwen3OmniVoiceBox, {"batch_window_s": 0.001, "max_turns": 2},
                          "qwen3-omni-voicebox-two-turns")


async def render_job(stage: Qwen3OmniVoiceBox, pool: BlockPool, job: VoiceBoxJob) -> np.ndarray:
    """The job's PCM (one output, 24 kHz)."""
    return await voiced_pcm(stage, pool, job, 24000)


async def render_turn(stage: Qwen3OmniVoiceBox, pool: BlockPool, jobs: list[VoiceBoxJob]
                      ) -> list[np.ndarray]:
    """Each of a turn's jobs' PCM, the jobs sent one after another."""
    return [await render_job(stage, pool, job) for job in jobs]


def error(pcm: np.ndarray, wave: np.ndarray) -> float:
    assert pcm.shape == wave.shape
    return float(np.abs(pcm - wave).max())


async def test_a_turn_streamed_in_groups_is_the_reference_decode(
        voicebox: Qwen3OmniVoiceBox, pool: BlockPool, reference: Qwen3OmniMoeCode2Wav) -> None:
    """Groups of 1, 4, 16 and 16 frames (the tiny 12-frame window crossed), each voiced as it
    comes, then the closing job: joined, the reference's decode of all 37 frames."""
    groups = [1, 4, 16, 16]
    codes = turn_codes(sum(groups), seed=1)
    began = time.perf_counter()
    pcms = await render_turn(voicebox, pool, group_jobs("solo/1", codes, groups))
    print_figure("qwen3-omni-voicebox", "37 frames in 5 jobs", time.perf_counter() - began, "s")
    assert [len(pcm) for pcm in pcms] == [SAMPLES_PER_FRAME - HELD_BACK, 4 * SAMPLES_PER_FRAME,
                                          16 * SAMPLES_PER_FRAME, 16 * SAMPLES_PER_FRAME, 0]
    assert all(pcm.dtype == np.float32 for pcm in pcms)
    difference = error(np.concatenate(pcms), decoded(reference, codes))
    print(f"\n[qwen3-omni-voicebox] streamed turn vs whole decode: {difference:.2g}")
    assert difference <= TOLERANCE
    assert not voicebox.turns, "the closing job ends the turn's stream"


async def test_concurrent_turns_share_batches_and_each_is_its_own_decode(
        voicebox: Qwen3OmniVoiceBox, pool: BlockPool, reference: Qwen3OmniMoeCode2Wav) -> None:
    """Three calls' turns, grouped differently, sent at once: their jobs render in shared
    batches (fewer forwards than jobs), mixing call sizes and histories, and each turn's audio
    is the reference's decode of its own frames."""
    groupings = [[1, 4, 16], [4, 4, 4, 4], [16, 1, 2]]
    turns = [turn_codes(sum(groups), seed=10 + index) for index, groups in enumerate(groupings)]
    calls, rendered = voicebox.forward_calls, voicebox.jobs_rendered
    began = time.perf_counter()
    pcms = await asyncio.gather(*(
        render_turn(voicebox, pool, group_jobs(f"call{index}/1", codes, groups))
        for index, (codes, groups) in enumerate(zip(turns, groupings, strict=True))))
    elapsed = time.perf_counter() - began
    jobs = sum(len(groups) + 1 for groups in groupings)
    forwards = voicebox.forward_calls - calls
    print_figure("qwen3-omni-voicebox", f"3 turns, {jobs} jobs in {forwards} batches", elapsed,
                 "s")
    assert voicebox.jobs_rendered - rendered == jobs
    assert forwards < jobs
    for codes, turn in zip(turns, pcms, strict=True):
        difference = error(np.concatenate(turn), decoded(reference, codes))
        print(f"\n[qwen3-omni-voicebox] batched turn vs its whole decode: {difference:.2g}")
        assert difference <= TOLERANCE
    assert not voicebox.turns


async def test_a_malformed_job_fails_alone(
        voicebox: Qwen3OmniVoiceBox, pool: BlockPool, reference: Qwen3OmniMoeCode2Wav) -> None:
    """Jobs of partial frames, or with a code outside the codebooks, sent with a good one: each
    bad one fails with an error naming its fault, the good one (a whole turn in one job,
    `more=False`) is voiced, and no turn is left behind."""
    codes = turn_codes(6, seed=20)
    outside = flat(codes[:, :2])
    outside[CODEBOOKS + 3] = CODEBOOK_SIZE  # frame 1, codebook 3
    negative = flat(codes[:, :1])
    negative[0] = -1
    jobs = [VoiceBoxJob("good/1/voicebox/0", flat(codes)),
            VoiceBoxJob("partial/1/voicebox/0", flat(codes)[:-1], more=True),
            VoiceBoxJob("outside/1/voicebox/0", outside, more=True),
            VoiceBoxJob("negative/1/voicebox/0", negative, more=True)]
    calls = voicebox.forward_calls
    good, *bad = await asyncio.gather(*(render_job(voicebox, pool, job) for job in jobs),
                                      return_exceptions=True)
    assert voicebox.forward_calls == calls + 1  # the good job's batch
    assert isinstance(good, np.ndarray)
    assert error(good, decoded(reference, codes)) <= TOLERANCE
    assert [type(failure) for failure in bad] == [ValueError] * 3
    assert "95 codes are not whole frames of 16" in str(bad[0])
    assert "code 128 (frame 1, codebook 3) is outside the codebook (0 to 127)" in str(bad[1])
    assert "code -1 (frame 0, codebook 0)" in str(bad[2])
    assert not voicebox.turns


async def test_abort_drops_the_turn_and_a_cancelled_job_keeps_its_context(
        voicebox: Qwen3OmniVoiceBox, pool: BlockPool, reference: Qwen3OmniMoeCode2Wav) -> None:
    """An aborted turn's stream is gone: its next job starts an utterance afresh. A job whose
    caller went away while it waited is not voiced, yet its frames stay its turn's context."""
    codes = turn_codes(8, seed=30)
    await render_job(voicebox, pool, VoiceBoxJob("cut/1/voicebox/0", flat(codes[:, :4]),
                                                 more=True))
    assert "cut/1/voicebox" in voicebox.turns
    await voicebox.abort(["cut/1/voicebox/0"])
    assert "cut/1/voicebox" not in voicebox.turns
    again = await render_job(voicebox, pool, VoiceBoxJob("cut/1/voicebox/1",
                                                         flat(codes[:, 4:8])))
    assert error(again, decoded(reference, codes[:, 4:8])) <= TOLERANCE  # a fresh start

    rendered = voicebox.jobs_rendered
    left = asyncio.create_task(render_job(
        voicebox, pool, VoiceBoxJob("gone/1/voicebox/0", flat(codes[:, :4]), more=True)))
    await asyncio.sleep(0.01)  # queued; the batch window still open
    left.cancel()
    await asyncio.gather(left, return_exceptions=True)
    after = await render_job(voicebox, pool, VoiceBoxJob("gone/1/voicebox/1",
                                                         flat(codes[:, 4:8])))
    assert voicebox.jobs_rendered == rendered + 1  # the cancelled job was not voiced
    whole = decoded(reference, codes)  # but its frames came before the next job's
    assert error(after, whole[4 * SAMPLES_PER_FRAME - HELD_BACK:]) <= TOLERANCE
    assert not voicebox.turns


async def test_turns_beyond_max_turns_age_out(two_turns: Qwen3OmniVoiceBox,
                                              pool: BlockPool) -> None:
    codes = turn_codes(1, seed=40)
    for index in range(3):
        await render_job(two_turns, pool, VoiceBoxJob(f"call{index}/1/voicebox/0", flat(codes),
                                                      more=True))
    assert list(two_turns.turns) == ["call1/1/voicebox", "call2/1/voicebox"]
