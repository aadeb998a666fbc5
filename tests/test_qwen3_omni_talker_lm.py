"""Qwen3-Omni's talker LM (`qwen3_omni/talker_lm.py`) against transformers' talker, on the tiny
release.

The tiny release is transformers' own Qwen3-Omni at test size with RANDOM weights from a fixed
seed, every constant-initialised parameter perturbed (the shared-expert gates and routers
among them: pipeline/families/qwen3_omni/release.py). The reference is its talker's text model
and codec head (`Qwen3OmniMoeTalkerForConditionalGeneration.model` then `.codec_head`, loaded
from the release), over input rows of the kinds its generate() builds: projected thinker
text embeddings and states plus codec embeddings (the prefill), then frames' inputs, the sum of
a frame's 16 codebook embeddings (codebook 0 by the talker's codec embedding, 1-15 by the code
predictor's) plus a projected reply-text embedding.

- torch: the converted directory in transformers' `Qwen3MoeForCausalLM` with the gated shared
  expert grafted as vLLM's Qwen3-MoE computes it (`torch_talker_lm`) gives the reference's
  logits to within LOGITS_ATOL, while a dropped piece (the stock class with no shared expert,
  the gate made constant, a q norm reset, two routed experts swapped) fails that comparison
  by orders of magnitude; and every config field the Qwen3-MoE classes read carries the
  talker's value.
- vLLM: one engine serves the converted LM over prompt embeddings (`enable_prompt_embeds`, no
  tokenizer) and its greedy codebook-0 token for the prompt is the reference's, and its next
  STEPS greedy tokens (vLLM embedding each token with the codec embedding) are the torch
  copy's `generate()`: vLLM's CPU fused MoE with its shared expert, step after step.
- vLLM as a pooling model (docs/decisions/qwen3-omni-talker-on-vllm.md) through the engine
  wrapper (`VllmEngine.pooled`, `LAST_STATE_POOLING`): one request per frame over the growing
  history of prompt embeddings, LAST pooling without activation, hands back the talker's
  final-norm hidden state (what the code predictor reads; the codec head on it gives codebook
  0's logits), and prefix caching reuses the history's full KV blocks; a request aborted
  through `VllmEngine.abort` hands back nothing, and the engine pools on.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import Qwen3MoeForCausalLM, Qwen3OmniMoeForConditionalGeneration
from transformers import Qwen3OmniMoeTalkerForConditionalGeneration as Talker

from pipeline.engines.vllm import (
    LAST_STATE_POOLING,
    Pooled,
    VllmEngine,
)
from pipeline.families.qwen3_omni.build import SEED
from pipeline.families.qwen3_omni.release import write_tiny_release
from pipeline.families.qwen3_omni.talker_lm import (
    SHARED_EXPERT_FIELD,
    SharedExpertQwen3MoeForCausalLM,
    lm_config,
    text_config,
    torch_talker_lm,
    write_talker_lm,
)
from pipeline.families.qwen3_omni.tiny_config import NUM_CODE_GROUPS, TokenIds
from tests.lm_checks import (
    assert_weightless_copy,
    embeds_engine,
    greedy_tokens,
    reset_q_norm,
    swap_two_experts,
)
from tests.stage_fixtures import print_figure

BENCH = "qwen3-omni-talker-lm"
PREFILL_ROWS = 12  # projected thinker rows with codec embeddings, as the talker's prefill
FRAMES = 16  # frame rows after them
STEPS = 12  # greedy tokens vLLM generates past the first
ABORT_WAIT_S = 5.0  # an aborted request's call returns within this (at once, in fact)
POOLING_BLOCK = 32  # KV block size of the pooling engine (CPU attention: multiples of 32)
STATE_ATOL = 1e-5  # final-norm hidden state, vLLM against torch (measured 8e-7)
# max |logit difference| over every position, float32 (measured 0.0 on this machine; the
# logits spread with std about 0.2, each broken piece below moves them by 6e-3 or more)
LOGITS_ATOL = 1e-5
BROKEN_FACTOR = 100  # a dropped piece must move the logits this many tolerances at least
READ_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
               "max_position_embeddings", "rms_norm_eps", "attention_bias",
               "moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob",
               SHARED_EXPERT_FIELD)


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The family's tiny release (its seed), written once for the module."""
    torch.set_num_threads(1)
    directory = tmp_path_factory.mktemp("release")
    write_tiny_release(directory, SEED)
    return directory


@pytest.fixture(scope="module")
def lm_dir(release: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("talker_lm")
    write_talker_lm(release, directory)
    return directory


@pytest.fixture(scope="module")
def omni(release: Path) -> Qwen3OmniMoeForConditionalGeneration:
    """transformers' Qwen3-Omni from the release (the talker's reference, the thinker's
    embedding for its inputs)."""
    model: Qwen3OmniMoeForConditionalGeneration = (
        Qwen3OmniMoeForConditionalGeneration.from_pretrained(release, dtype=torch.float32).eval())
    return model


@pytest.fixture(scope="module")
def talker(omni: Qwen3OmniMoeForConditionalGeneration) -> Talker:
    loaded: Talker = omni.talker
    return loaded


@pytest.fixture(scope="module")
def embeds(omni: Qwen3OmniMoeForConditionalGeneration, talker: Talker) -> torch.Tensor:
    return _talker_rows(talker, omni.thinker.get_input_embeddings())


@torch.inference_mode()
def _talker_rows(talker: Talker, thinker_embedding: torch.nn.Embedding) -> torch.Tensor:
    """(PREFILL_ROWS + FRAMES, hidden) input rows of the talker's kinds, from a fixed seed:
    text_projection(thinker text embeddings) and hidden_projection(thinker states) plus codec
    embeddings, then per frame the sum of its 16 codebook embeddings plus a projected text
    embedding (the per-step input transformers' talker builds in prepare_inputs_for_generation)."""
    generator = torch.Generator().manual_seed(11)
    text_ids = torch.randint(0, TokenIds().user, (PREFILL_ROWS + FRAMES,), generator=generator)
    text = talker.text_projection(thinker_embedding(text_ids))
    states = torch.randn(PREFILL_ROWS // 2, thinker_embedding.embedding_dim, generator=generator)
    text[: PREFILL_ROWS // 2] = talker.hidden_projection(states)  # the user turn's audio rows
    codebook = talker.code_predictor.config.vocab_size
    codes = torch.randint(0, codebook, (PREFILL_ROWS + FRAMES, NUM_CODE_GROUPS),
                          generator=generator)
    rows = text + talker.get_input_embeddings()(codes[:, 0])
    residual_tables = talker.code_predictor.get_input_embeddings()
    for group in range(1, NUM_CODE_GROUPS):
        residual = residual_tables[group - 1](codes[PREFILL_ROWS:, group])
        rows[PREFILL_ROWS:] += residual
    return rows.clone()


@torch.inference_mode()
def _reference_logits(talker: Talker, embeds: torch.Tensor) -> torch.Tensor:
    hidden = talker.model(inputs_embeds=embeds[None]).last_hidden_state
    logits: torch.Tensor = talker.codec_head(hidden)[0]
    return logits


@torch.inference_mode()
def _lm_logits(lm: Qwen3MoeForCausalLM, embeds: torch.Tensor) -> torch.Tensor:
    logits: torch.Tensor = lm(inputs_embeds=embeds[None]).logits[0]
    return logits


def test_the_lm_config_carries_every_field_the_decoder_reads(release: Path,
                                                              lm_dir: Path) -> None:
    text, lm = text_config(release), lm_config(release)
    assert lm.architectures == ["Qwen3MoeForCausalLM"] and lm.model_type == "qwen3_moe"
    differing = {f: (getattr(lm, f), getattr(text, f)) for f in READ_FIELDS
                 if getattr(lm, f) != getattr(text, f)}
    assert differing == {}
    assert getattr(lm, SHARED_EXPERT_FIELD) > 0, "the tiny talker has a shared expert"
    assert lm.rope_parameters == {"rope_type": "default",
                                  "rope_theta": text.rope_parameters["rope_theta"]}
    assert (lm.decoder_sparse_step, lm.mlp_only_layers, lm.sliding_window) == (1, [], None)
    assert not lm.tie_word_embeddings, "the release has a codec head of its own"
    written = Qwen3MoeForCausalLM.config_class.from_pretrained(lm_dir)
    assert {f: getattr(written, f) for f in READ_FIELDS} == {f: getattr(lm, f)
                                                              for f in READ_FIELDS}


def test_the_lm_holds_the_talker_lm_tensors_only(release: Path, lm_dir: Path) -> None:
    with safe_open(release / "model.safetensors", "pt") as source:
        talker_lm = {k for k in source.keys()  # noqa: SIM118 (safe_open is no mapping)
                     if k.startswith("talker.model.") or k == "talker.codec_head.weight"}
        with safe_open(lm_dir / "model.safetensors", "pt") as written:
            names = set(written.keys())
            assert torch.equal(written.get_tensor("model.embed_tokens.weight"),
                               source.get_tensor("talker.model.codec_embedding.weight"))
            assert torch.equal(written.get_tensor("lm_head.weight"),
                               source.get_tensor("talker.codec_head.weight"))
    assert len(names) == len(talker_lm)
    assert not any("code_predictor" in n or "projection" in n for n in names)
    assert json.loads((lm_dir / "generation_config.json").read_text())["eos_token_id"] == (
        Qwen3OmniMoeForConditionalGeneration.config_class.from_pretrained(release)
        .talker_config.codec_eos_token_id)


@pytest.mark.parametrize(("field", "value", "named"), [
    ("attention_bias", True, "attention_bias"),
    ("hidden_act", "gelu", "hidden_act"),
])
def test_a_talker_no_qwen3_moe_decoder_computes_is_refused(
        release: Path, tmp_path: Path, field: str, value: object, named: str) -> None:
    config = json.loads((release / "config.json").read_text())
    config["talker_config"]["text_config"][field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=named):
        lm_config(tmp_path)


def test_the_lm_gives_the_talkers_logits_over_the_same_embeddings(
        lm_dir: Path, talker: Talker, embeds: torch.Tensor) -> None:
    reference = _reference_logits(talker, embeds)
    logits = _lm_logits(torch_talker_lm(lm_dir), embeds)
    assert logits.shape == reference.shape == (embeds.shape[0], talker.config.text_config
                                               .vocab_size)
    diff = float((logits - reference).abs().max())
    print_figure(BENCH, "LM logits max |diff| vs the talker", diff * 1e6, "e-6")
    print_figure(BENCH, "logit spread (std)", float(reference.std()), "")
    assert diff <= LOGITS_ATOL


def _stock_class(lm_dir: Path) -> Qwen3MoeForCausalLM:
    """transformers' Qwen3MoeForCausalLM as it is: the shared expert's tensors left unread."""
    lm, info = Qwen3MoeForCausalLM.from_pretrained(lm_dir, dtype=torch.float32,
                                                   output_loading_info=True)
    assert any("shared_expert" in key for key in info["unexpected_keys"])
    stock: Qwen3MoeForCausalLM = lm.eval()
    return stock


def _constant_gate(lm: SharedExpertQwen3MoeForCausalLM) -> None:
    for layer in lm.model.layers:
        layer.mlp.shared_expert_gate.weight.zero_()  # sigmoid(0): every row's gate 0.5


def _broken(lm_dir: Path, breakage: Callable[[SharedExpertQwen3MoeForCausalLM], None]
            ) -> Qwen3MoeForCausalLM:
    lm = torch_talker_lm(lm_dir)
    with torch.no_grad():
        breakage(lm)
    return lm


@pytest.mark.parametrize("broken", [
    _stock_class,
    lambda lm_dir: _broken(lm_dir, _constant_gate),
    lambda lm_dir: _broken(lm_dir, reset_q_norm),
    lambda lm_dir: _broken(lm_dir, swap_two_experts),
], ids=["no shared expert (stock class)", "shared expert gate constant", "q_norm reset",
        "two routed experts swapped"])
def test_the_logit_comparison_sees_a_dropped_piece(
        lm_dir: Path, talker: Talker, embeds: torch.Tensor,
        broken: Callable[[Path], Qwen3MoeForCausalLM]) -> None:
    diff = float((_lm_logits(broken(lm_dir), embeds)
                  - _reference_logits(talker, embeds)).abs().max())
    print_figure(BENCH, "broken piece: logits max |diff|", diff, "")
    assert diff > BROKEN_FACTOR * LOGITS_ATOL


def test_a_weightless_release_gives_a_weightless_lm_of_the_same_tensors(
        release: Path, lm_dir: Path, tmp_path: Path) -> None:
    """Mapped from the headers: the same names, shapes and dtypes, the data a hole."""
    write_talker_lm(release, tmp_path, dummy_weights=True)
    assert_weightless_copy(lm_dir, tmp_path)


@pytest.fixture(scope="module")
async def engine(lm_dir: Path) -> AsyncIterator[VllmEngine]:
    """The converted LM on one CPU engine, fed prompt embeddings, no tokenizer."""
    async with embeds_engine(lm_dir, BENCH) as started:
        yield started


@pytest.mark.engines
async def test_vllm_greedy_codebook0_tokens_equal_the_references(
        engine: VllmEngine, lm_dir: Path, talker: Talker, embeds: torch.Tensor) -> None:
    last = _reference_logits(talker, embeds)[-1]
    top2 = last.topk(2).values
    print_figure(BENCH, "reference top-two logit gap", float(top2[0] - top2[1]), "")
    with torch.inference_mode():
        copy: Any = torch_talker_lm(lm_dir)
        out = copy.generate(inputs_embeds=embeds[None], max_new_tokens=1 + STEPS,
                            do_sample=False, eos_token_id=None, pad_token_id=0)
    expected = out[0, -(1 + STEPS):].tolist()
    print_figure(BENCH, "distinct tokens in the torch copy's reply", len(set(expected)), "")
    assert expected[0] == int(last.argmax()), "the torch copy's first token is the talker's"
    tokens = await greedy_tokens(engine, "talker-parity", embeds, 1 + STEPS, BENCH)
    assert tokens[0] == int(last.argmax()), "vLLM's codebook-0 token is the talker's"
    assert tokens == expected, "then the same greedy tokens as the torch copy, step by step"


@pytest.fixture(scope="module")
async def pooling_engine(lm_dir: Path) -> AsyncIterator[VllmEngine]:
    """The converted LM as a pooling model on one CPU engine (`LAST_STATE_POOLING`): the last
    row's final-norm hidden state of prompt embeddings, prefix caching on (vLLM's default)."""
    async with embeds_engine(lm_dir, BENCH, "pooling engine start", **LAST_STATE_POOLING,
                             block_size=POOLING_BLOCK) as started:
        yield started


async def _pooled(engine: VllmEngine, rows: torch.Tensor, request_id: str) -> Pooled:
    """The pooled state of one request over `rows` (not aborted)."""
    pooled = await engine.pooled(request_id, rows)
    assert pooled is not None, f"request {request_id} was not aborted"
    return pooled


@pytest.mark.engines
async def test_vllm_pooling_hands_the_talkers_state_per_frame_request(
        pooling_engine: VllmEngine, lm_dir: Path, talker: Talker, embeds: torch.Tensor) -> None:
    frames = embeds[PREFILL_ROWS:]
    rows = torch.cat([embeds, frames.std() * torch.randn(
        2 * POOLING_BLOCK, embeds.shape[1], generator=torch.Generator().manual_seed(5))])
    head = torch_talker_lm(lm_dir).lm_head.weight
    worst, cached, took = 0.0, [], []
    for n in range(PREFILL_ROWS, rows.shape[0] + 1):  # a request per frame, history growing
        began = time.perf_counter()
        pooled = await _pooled(pooling_engine, rows[:n], f"frame-{n}")
        took.append(time.perf_counter() - began)
        state = pooled.state
        assert state.dtype == torch.float32 and state.shape == (rows.shape[1],)
        with torch.inference_mode():
            reference = talker.model(inputs_embeds=rows[None, :n]).last_hidden_state[0, -1]
            assert int((head @ state).argmax()) == int(talker.codec_head(reference).argmax())
        worst = max(worst, float((state - reference).abs().max()))
        cached.append(pooled.cached_tokens)
    print_figure(BENCH, "pooled state max |diff| vs the talker", worst * 1e6, "e-6")
    print_figure(BENCH, "per-frame pooling request (median)",
                 sorted(took)[len(took) // 2] * 1e3, "ms")
    assert worst <= STATE_ATOL
    full_blocks = [(n - 1) // POOLING_BLOCK * POOLING_BLOCK
                   for n in range(PREFILL_ROWS, rows.shape[0] + 1)]
    assert cached == full_blocks, "every full block of the history is reused"


@pytest.mark.engines
async def test_an_aborted_pooling_request_hands_nothing_and_the_engine_goes_on(
        pooling_engine: VllmEngine, embeds: torch.Tensor) -> None:
    """`abort` ends a pooling request in flight: its call returns None at once, vLLM keeps
    no state of it, and the next request pools as before."""
    rows = embeds.repeat(256 // embeds.shape[0], 1)  # as long a prompt as the engine takes
    waiting = asyncio.create_task(pooling_engine.pooled("to-abort", rows))
    while "to-abort" not in pooling_engine.active_request_ids():
        await asyncio.sleep(0)  # until the request is in the engine
    await pooling_engine.abort(["to-abort"])
    assert await asyncio.wait_for(waiting, ABORT_WAIT_S) is None
    assert pooling_engine.active_request_ids() == []
    again = await _pooled(pooling_engine, embeds, "after-abort")
    assert again.state.shape == (embeds.shape[1],) and bool(again.state.isfinite().all())
