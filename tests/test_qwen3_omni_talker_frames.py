"""Qwen3-Omni's Talker frame by frame (`qwen3_omni/talker_frames.py`, `code_predictor.py`)
against transformers' talker, on the tiny release.

The reference (tests/qwen3_omni_reference.py) is transformers 5.19's own generate() on the
family's tiny release with its thinker embedding redrawn: `Qwen3OmniMoeForConditionalGeneration`
runs its thinker on a text prompt (greedy, stopped at a token of its reply chosen as the stop
token), builds the talker's inputs (`_get_talker_user_parts`, `_get_talker_assistant_parts`,
the trailing text rows) and runs `talker.generate` greedy (do_sample False, so its code
predictor is greedy too) for FRAMES frames, every codec special but eos suppressed as
`suppressed_ids` says. Its inputs, states and codes are recorded.

Ours: the Thinker's rows as the lead's contract has them (text_projection of the thinker's
embeddings: the prompt part, then one row per reply token, the stop token included), a
`TalkerTurn` stepped by `speak` with the torch copy of the converted LM (`torch_talker_lm`)
as its pool function and the release's `TalkerParts` for codebook 0 and the code predictor.
Every code of every frame must be the reference's (greedy, with and without the repetition
penalty, the reply given at once or token by token); the rows fed and the pooled states match
to the tolerances below. A dropped piece (the side row, the residual embeddings, the tts_eos
row, the stop token's row not dropped) changes the frames; three turns batched give each its
solo frames; an aborted turn starts no step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen3OmniMoeForConditionalGeneration
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from pipeline.families.kit.work_thread import WorkThread
from pipeline.families.qwen3_omni.code_predictor import (
    CodePredictor,
    Pick,
    pick_codes,
    pick_probabilities,
)
from pipeline.families.qwen3_omni.talker_frames import (
    GREEDY_FRAMES,
    FrameSampling,
    Pool,
    TalkerParts,
    TalkerTurn,
    batched_frames,
    penalised,
    speak,
    suppressed_ids,
)
from pipeline.families.qwen3_omni.talker_lm import torch_talker_lm, write_talker_lm
from pipeline.families.qwen3_omni.tiny_config import CODEBOOK_SIZE, NUM_CODE_GROUPS
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
from tests.stage_fixtures import print_figure

# transformers warns that the penalty skips the prompt: the reference's generate() wants that
pytestmark = pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")

BENCH = "qwen3-omni-talker-frames"
FRAMES = 20
# The rows fed, ours against the reference's inputs_embeds (measured 0.0: both project the
# same embeddings by the same layers and sum the same embeddings in the same order)
ROWS_ATOL = 1e-6
# h_k, the torch copy's final-norm state over the whole history against the reference's
# KV-cached step (measured 1.5e-6 at states of std about 1)
STATE_ATOL = 1e-5
PROBABILITY_ATOL = 1e-6


# The family's tiny release, its thinker embedding redrawn (`write_reference_release`: at
# transformers' std the projected text rows are all but the same row), and the model from it.
release = release_fixture()
omni = omni_fixture()


@pytest.fixture(scope="module")
def parts(release: Path) -> TalkerParts:
    return TalkerParts.load(release)


@pytest.fixture(scope="module")
def pool(release: Path, tmp_path_factory: pytest.TempPathFactory) -> Pool:
    """h of the last row from the torch copy of what vLLM serves, over the whole history."""
    directory = tmp_path_factory.mktemp("talker_lm")
    write_talker_lm(release, directory)
    lm = torch_talker_lm(directory)

    async def pooled(rows: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            state: torch.Tensor = lm.model(inputs_embeds=rows[None]).last_hidden_state[0, -1]
        return state

    return pooled


@pytest.fixture(scope="module")
def thread() -> Iterator[WorkThread]:
    work = WorkThread("talker-frames-test")
    yield work
    work.close()


@pytest.fixture(scope="module")
def references(omni: Qwen3OmniMoeForConditionalGeneration) -> dict[float, Reference]:
    """The reference greedy without and with the reference's repetition penalty."""
    began = time.perf_counter()
    made = {penalty: generate_reference(omni, penalty, FRAMES) for penalty in (1.0, 1.05)}
    print_figure(BENCH, f"reference generate, {FRAMES} frames (each)",
                 (time.perf_counter() - began) / 2, "s")
    return made


async def _spoken(turn: TalkerTurn, pool: Pool, frames: Any) -> list[list[int]]:
    return [codes async for codes in speak(turn, pool, frames)]


async def _voice(parts: TalkerParts, pool: Pool, frames: Any, prompt: torch.Tensor,
                 reply: torch.Tensor, sampling: FrameSampling, voice: str = VOICE,
                 stream: bool = False) -> tuple[TalkerTurn, list[list[int]]]:
    """A turn over these rows to its end; `stream`: the reply a row at a time, the frames
    stepped between (the Thinker streaming)."""
    turn = TalkerTurn(parts, voice, sampling)
    turn.add_prompt(prompt)
    made: list[list[int]] = []
    for row in reply if stream else [reply]:
        turn.add_reply(row.reshape(-1, reply.shape[1]))
        made += await _spoken(turn, pool, frames)
    turn.end_text()
    made += await _spoken(turn, pool, frames)
    assert made == turn.frames
    return turn, made


def _recording(pool: Pool, states: list[torch.Tensor]) -> Pool:
    async def pooled(rows: torch.Tensor) -> torch.Tensor:
        state = await pool(rows)
        states.append(state)
        return state

    return pooled


@pytest.mark.parametrize("stream", [False, True], ids=["reply at once", "reply token by token"])
@pytest.mark.parametrize("penalty", [1.0, 1.05])
async def test_the_frames_are_the_references_codes(
        omni: Qwen3OmniMoeForConditionalGeneration, references: dict[float, Reference],
        parts: TalkerParts, pool: Pool, thread: WorkThread, penalty: float,
        stream: bool) -> None:
    reference = references[penalty]
    assert len(reference.codes) == FRAMES and len(reference.codes[0]) == NUM_CODE_GROUPS
    if penalty != 1.0:
        assert reference.codes != references[1.0].codes, "the penalty changes the frames"
    states: list[torch.Tensor] = []
    sampling = replace(GREEDY_FRAMES, repetition_penalty=penalty, max_frames=FRAMES)
    began = time.perf_counter()
    turn, made = await _voice(parts, _recording(pool, states), batched_frames(thread, parts),
                              text_rows(omni, prompt_ids()), text_rows(omni, reference.reply),
                              sampling, stream=stream)
    print_figure(BENCH, f"our {FRAMES} frames (torch pool)", time.perf_counter() - began, "s")
    assert made == reference.codes, "every code of every frame is the reference's"
    prefill = reference.prefill.shape[0]
    rows_diff = max(float((turn.rows[:prefill] - reference.prefill).abs().max()),
                    float((turn.rows[prefill:] - reference.steps[:FRAMES - 1]).abs().max()))
    state_diff = float((torch.stack(states) - reference.states).abs().max())
    print_figure(BENCH, "rows fed, max |diff| vs the reference", rows_diff * 1e6, "e-6")
    print_figure(BENCH, "pooled states, max |diff| vs the reference", state_diff * 1e6, "e-6")
    assert turn.rows.shape[0] == prefill + FRAMES - 1, "the last frame's row is never fed"
    assert rows_diff <= ROWS_ATOL
    assert state_diff <= STATE_ATOL
    c0s = [frame[0] for frame in made]
    print_figure(BENCH, "distinct codebook-0 codes in the reference's frames", len(set(c0s)), "")


def _no_side_row(monkeypatch: pytest.MonkeyPatch) -> None:
    side = TalkerTurn.next_side

    def zero(turn: TalkerTurn) -> tuple[torch.Tensor, str] | None:
        found = side(turn)
        return None if found is None else (torch.zeros_like(found[0]), found[1])

    monkeypatch.setattr(TalkerTurn, "next_side", zero)


def _no_residual_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    def codebook0(predictor: CodePredictor, codes: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            rows: torch.Tensor = predictor.codec_embedding(codes[:, 0]).float()
        return rows

    monkeypatch.setattr(CodePredictor, "frame_rows", codebook0)


def _no_tts_eos(monkeypatch: pytest.MonkeyPatch) -> None:
    side = TalkerTurn.next_side

    def pad(turn: TalkerTurn) -> tuple[torch.Tensor, str] | None:
        found = side(turn)
        return (turn.parts.tts_pad, "eos") if found is not None and found[1] == "eos" else found

    monkeypatch.setattr(TalkerTurn, "next_side", pad)


def _stop_row_fed(monkeypatch: pytest.MonkeyPatch) -> None:
    def keep(turn: TalkerTurn) -> None:
        turn.text_ended = True

    monkeypatch.setattr(TalkerTurn, "end_text", keep)


@pytest.mark.parametrize("breakage", [_no_side_row, _no_residual_rows, _no_tts_eos,
                                      _stop_row_fed],
                         ids=["no side row", "no residual embeddings in x_k",
                              "tts_pad for tts_eos", "the stop token's row fed"])
async def test_the_frames_comparison_sees_a_dropped_piece(
        omni: Qwen3OmniMoeForConditionalGeneration, references: dict[float, Reference],
        parts: TalkerParts, pool: Pool, thread: WorkThread, monkeypatch: pytest.MonkeyPatch,
        breakage: Callable[[pytest.MonkeyPatch], None]) -> None:
    reference = references[1.0]
    breakage(monkeypatch)
    _, made = await _voice(parts, pool, batched_frames(thread, parts),
                           text_rows(omni, prompt_ids()), text_rows(omni, reference.reply),
                           replace(GREEDY_FRAMES, max_frames=FRAMES))
    differing = sum(a != b for a, b in zip(made, reference.codes, strict=True))
    print_figure(BENCH, "broken piece: frames differing from the reference", differing, "")
    assert differing > 0


TURNS = [(1, "ethan"), (2, "chelsie"), (3, "aiden")]


@pytest.mark.parametrize("sampling", [
    replace(GREEDY_FRAMES, max_frames=FRAMES),
    FrameSampling(max_frames=FRAMES),  # the reference's sampling, each turn its own seed
], ids=["greedy", "sampled"])
async def test_three_turns_batched_give_each_its_solo_frames(
        omni: Qwen3OmniMoeForConditionalGeneration, parts: TalkerParts, pool: Pool,
        thread: WorkThread, sampling: FrameSampling) -> None:
    rows = [turn_rows(omni, seed) for seed, _ in TURNS]
    samplings = [replace(sampling, seed=seed) for seed, _ in TURNS]
    solo = []
    for (prompt, reply), (_, voice), each in zip(rows, TURNS, samplings, strict=True):
        solo.append((await _voice(parts, pool, batched_frames(thread, parts), prompt, reply,
                                  each, voice))[1])
    frames = batched_frames(thread, parts)
    began = time.perf_counter()
    together = await asyncio.gather(*[
        _voice(parts, pool, frames, prompt, reply, each, voice)
        for (prompt, reply), (_, voice), each in zip(rows, TURNS, samplings, strict=True)])
    print_figure(BENCH, f"3 turns batched, {FRAMES} frames", time.perf_counter() - began, "s")
    assert max(frames.sizes) == len(TURNS), "the turns' frames ran in batches of three"
    assert [made for _, made in together] == solo
    assert all(len(made) == FRAMES for made in solo)
    assert len({str(made) for made in solo}) == len(TURNS), "three different turns"


def test_a_batch_mixing_the_end_of_speech_gives_each_job_its_own(
        omni: Qwen3OmniMoeForConditionalGeneration, parts: TalkerParts) -> None:
    """A state pointing at codec eos ends its turn (no residual codes, no row) while the
    other job of the batch gets its solo frame."""
    eos_state = 50 * parts.head[parts.codec.eos]
    speaking = torch.randn(parts.head.shape[1], generator=torch.Generator().manual_seed(6))
    jobs = [TalkerTurn(parts, VOICE, GREEDY_FRAMES).job(state)
            for state in (eos_state, speaking)]
    ended, made = parts.frames(jobs)
    (solo,) = parts.frames(jobs[1:])
    assert (ended.codes, ended.row) == ([parts.codec.eos], None)
    assert made.codes == solo.codes and len(made.codes) == NUM_CODE_GROUPS
    assert made.row is not None and solo.row is not None and torch.equal(made.row, solo.row)
    turn = TalkerTurn(parts, VOICE, GREEDY_FRAMES)
    turn.add_prompt(torch.zeros(5, parts.head.shape[1]))
    turn.add_reply(torch.zeros(3, parts.head.shape[1]))
    assert turn.next_rows() is not None
    assert not turn.take(ended) and turn.speech_ended and turn.next_rows() is None


async def test_an_aborted_turn_starts_no_step(
        omni: Qwen3OmniMoeForConditionalGeneration, parts: TalkerParts, pool: Pool,
        thread: WorkThread) -> None:
    prompt, reply = turn_rows(omni, 1)
    turn = TalkerTurn(parts, VOICE, replace(GREEDY_FRAMES, max_frames=FRAMES))
    turn.add_prompt(prompt)
    turn.add_reply(reply)
    turn.end_text()
    requests: list[torch.Tensor] = []
    frames = batched_frames(thread, parts)
    made = []
    async for codes in speak(turn, _recording(pool, requests), frames):
        made.append(codes)
        if len(made) == 3:
            turn.abort()
    assert (len(made), len(requests), turn.next_rows()) == (3, 3, None)

    async def barge_in(rows: torch.Tensor) -> torch.Tensor:
        state = await pool(rows)
        if len(rows) > prefill:  # a barge-in while the second frame's request runs
            second.abort()
        return state

    second = TalkerTurn(parts, VOICE, replace(GREEDY_FRAMES, max_frames=FRAMES))
    second.add_prompt(prompt)
    second.add_reply(reply)
    second.end_text()
    prefill = prompt.shape[0] + 6  # U + 3 prompt rows: U user rows and 9 assistant rows
    frames = batched_frames(thread, parts)
    assert await _spoken(second, barge_in, frames) == made[:1]
    assert list(frames.sizes) == [1], "the aborted step's frame never ran"


async def test_a_turn_waits_for_the_next_reply_row_and_skips_a_lone_stop_token(
        omni: Qwen3OmniMoeForConditionalGeneration, parts: TalkerParts, pool: Pool,
        thread: WorkThread) -> None:
    prompt, reply = turn_rows(omni, 2)
    turn = TalkerTurn(parts, VOICE, GREEDY_FRAMES)
    turn.add_prompt(prompt)
    turn.add_reply(reply[:1])
    assert turn.next_rows() is None, "the first reply row may be the stop token's"
    turn.add_reply(reply[1:2])
    assert await _spoken(turn, pool, batched_frames(thread, parts)) != []
    assert turn.next_rows() is None, "the next side row waits for the reply's third row"
    lone = TalkerTurn(parts, VOICE, GREEDY_FRAMES)
    lone.add_prompt(prompt)
    lone.add_reply(reply[-1:])
    lone.end_text()
    assert (lone.next_rows(), lone.speech_ended) == (None, True)
    with pytest.raises(ValueError, match="voice"):
        TalkerTurn(parts, "nobody")


def test_the_suppressed_ids_are_the_references_on_the_release_and_the_specials_at_tiny_size(
        parts: TalkerParts) -> None:
    published = [i for i in range(3072 - 1024, 3072) if i != 2150]  # generate()'s own list
    assert suppressed_ids(3072, 2048, 2150) == published
    vocab, eos = parts.head.shape[0], parts.codec.eos
    assert suppressed_ids(vocab, CODEBOOK_SIZE, eos) == [
        i for i in range(CODEBOOK_SIZE, vocab) if i != eos]
    assert parts.suppressed.sum() == vocab - CODEBOOK_SIZE - 1


def test_codebook0_sampling_is_the_reference_generates_chain(parts: TalkerParts) -> None:
    """Repetition penalty, suppression, temperature, top-k and top-p against transformers'
    own processors, in generate()'s order."""
    generator = torch.Generator().manual_seed(3)
    vocab = parts.head.shape[0]
    logits = 3 * torch.randn(4, vocab, generator=generator)
    earlier = [tuple(torch.randint(0, CODEBOOK_SIZE, (n,), generator=generator).tolist())
               for n in (0, 1, 5, 40)]
    for pick, penalty in [(Pick(False, 0.9, 50, 1.0), 1.05), (Pick(False, 1.0, 50, 0.8), 1.0),
                          (Pick(False, 0.7, 0, 0.5), 1.3), (Pick(False, 1.2, 3, 1.0), 1.05)]:
        ours = penalised(logits, list(earlier), [penalty] * 4).masked_fill(
            parts.suppressed, float("-inf"))
        ours = pick_probabilities(ours, [pick] * 4)
        theirs = logits.clone()
        for row, codes in enumerate(earlier):
            if codes:
                ids = torch.tensor([codes])
                theirs[row:row + 1] = RepetitionPenaltyLogitsProcessor(penalty)(
                    ids, theirs[row:row + 1])
        theirs = SuppressTokensLogitsProcessor(
            suppressed_ids(vocab, CODEBOOK_SIZE, parts.codec.eos))(torch.zeros(4, 0), theirs)
        theirs = TemperatureLogitsWarper(pick.temperature)(None, theirs)
        if pick.top_k:
            theirs = TopKLogitsWarper(pick.top_k)(None, theirs)
        if pick.top_p < 1:
            theirs = TopPLogitsWarper(pick.top_p)(None, theirs)
        diff = float((ours - theirs.softmax(-1)).abs().max())
        assert diff <= PROBABILITY_ATOL, (pick, penalty, diff)


def test_sampled_codes_follow_the_distribution_and_the_generator() -> None:
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(4))
    pick = Pick(False, 0.8, 10, 0.9)
    probabilities = pick_probabilities(logits, [pick])[0]
    draws = torch.rand(20000, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    codes = pick_codes(logits.expand(len(draws), -1), [pick] * len(draws), draws)
    frequencies = torch.bincount(codes, minlength=64) / len(draws)
    assert set(codes.tolist()) == set(probabilities.nonzero()[:, 0].tolist())
    assert float((frequencies - probabilities).abs().max()) < 0.015
    greedy = pick_codes(logits, [Pick()], torch.zeros(1))
    assert int(greedy) == int(logits.argmax())
