"""Qwen3-Omni's thinker LM (`qwen3_omni/thinker_lm.py`) against transformers' thinker, on the
tiny release.

The tiny release is transformers' own Qwen3-Omni at test size with RANDOM weights from a fixed
seed, every constant-initialised parameter perturbed (pipeline/families/qwen3_omni/release.py).
The reference is its thinker (`Qwen3OmniMoeThinkerForConditionalGeneration`, loaded from the
release), fed what its processor makes of a chat turn with audio: text ids with one audio
token per audio-tower row, the Whisper features of a short synthetic waveform (the feature
extractor at the release's mel bins, the processor's padding), and its own M-RoPE positions.
The converted LM is fed the prompt embeddings a stage would send vLLM: the thinker's token
embeddings, its audio tower's rows in place of the audio tokens.

- torch: the converted directory in transformers' `Qwen3MoeForCausalLM` gives the reference's
  logits to within LOGITS_ATOL, while a dropped piece (q norms reset, two experts swapped, the
  top-k renormalisation off) fails that comparison by orders of magnitude, so it cannot pass
  vacuously; and every config field the Qwen3-MoE classes read carries the thinker's value.
- vLLM: one engine serves the converted LM over prompt embeddings (`enable_prompt_embeds`, no
  tokenizer: ids are all it compares) and its greedy tokens for STEPS steps equal the
  reference thinker's `generate()`. That runs vLLM's CPU fused-MoE kernel and its 1-D RoPE.
  (The reference's top-two logit gap is at least 4e-3 over those steps, thousands of times the
  float32 differences between kernels: equal tokens are a stable result, not a lucky one.)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import (
    Qwen3MoeForCausalLM,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
    WhisperFeatureExtractor,
)
from transformers import Qwen3OmniMoeThinkerForConditionalGeneration as Thinker

from pipeline.engines.vllm import VllmEngine
from pipeline.families.kit.release_build import release_dir
from pipeline.families.qwen3_omni.build import THINKER_LM, build_qwen3_omni
from pipeline.families.qwen3_omni.thinker_lm import lm_config, text_config, write_thinker_lm
from pipeline.families.qwen3_omni.tiny_config import TokenIds
from tests.audio_fixtures import gliding_wave
from tests.lm_checks import (
    assert_weightless_copy,
    embeds_engine,
    greedy_tokens,
    reset_q_norm,
    swap_two_experts,
)
from tests.stage_fixtures import print_figure

BENCH = "qwen3-omni-thinker"
STEPS = 40
SAMPLE_RATE = 16_000
AUDIO_SECONDS = 1.5
# max |logit difference| over every prompt position, float32: measured 0.0 on this machine
# (the logits spread with std 0.23; each broken piece below moves them by 0.04-0.06)
LOGITS_ATOL = 1e-5
BROKEN_FACTOR = 100  # a dropped piece must move the logits this many tolerances at least
# The config fields vLLM's Qwen3MoeForCausalLM (model_executor/models/qwen3_moe.py) and
# transformers' read, each equal to the thinker text config's.
READ_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
               "max_position_embeddings", "rms_norm_eps", "attention_bias",
               "decoder_sparse_step", "mlp_only_layers", "moe_intermediate_size", "num_experts",
               "num_experts_per_tok", "norm_topk_prob", "tie_word_embeddings")


@dataclass(frozen=True)
class Prompt:
    """A chat turn with audio, as the reference reads it and as the LM is fed it."""

    input_ids: torch.Tensor  # (1, n)
    features: torch.Tensor  # (1, mels, frames) Whisper features
    feature_mask: torch.Tensor  # (1, frames)
    embeds: torch.Tensor  # (n, hidden): token embeddings, audio-tower rows at the audio tokens


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The qwen3_omni family built from its tiny release (the thinker LM among its parts)."""
    torch.set_num_threads(1)
    return build_qwen3_omni(tmp_path_factory.mktemp("models"), progress=False)


@pytest.fixture(scope="module")
def thinker(family: Path) -> Thinker:
    """transformers' thinker from the same release (greedy replies of exactly STEPS tokens)."""
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(release_dir(family),
                                                                  dtype=torch.float32)
    model.thinker.generation_config.eos_token_id = None
    thinker: Thinker = model.thinker.eval()
    return thinker


@pytest.fixture(scope="module")
def prompt(family: Path, thinker: Thinker) -> Prompt:
    return _prompt(family, thinker)


@torch.inference_mode()
def _prompt(family: Path, thinker: Thinker) -> Prompt:
    """System text, then a user turn of audio, then the assistant's turn opened (the published
    chat layout, with random text ids), and its embeddings."""
    extractor = WhisperFeatureExtractor(feature_size=_mel_bins(family))
    waveform = gliding_wave(AUDIO_SECONDS).astype(np.float32)
    audio = extractor(waveform, sampling_rate=SAMPLE_RATE, padding=True, truncation=False,
                      return_attention_mask=True, return_tensors="pt")
    features, mask = audio["input_features"], audio["attention_mask"]
    rows = thinker.get_audio_features(features, mask).last_hidden_state
    ids, rng = TokenIds(), np.random.default_rng(3)
    words = [int(t) for t in rng.integers(0, ids.user, 12)]
    tokens = [ids.im_start, ids.system, *words, ids.im_end, ids.im_start, ids.user,
              ids.audio_start, *[ids.audio] * rows.shape[0], ids.audio_end, ids.im_end,
              ids.im_start, ids.assistant]
    input_ids = torch.tensor([tokens])
    embeds = thinker.get_input_embeddings()(input_ids)[0].clone()
    embeds[input_ids[0] == ids.audio] = rows.to(embeds.dtype)
    return Prompt(input_ids, features, mask, embeds)


def _mel_bins(family: Path) -> int:
    """The audio tower's mel bins, as the release's config.json says."""
    config: Any = Qwen3OmniMoeConfig.from_pretrained(release_dir(family)).thinker_config
    return int(config.audio_config.num_mel_bins)


def _reference_inputs(prompt: Prompt) -> dict[str, torch.Tensor]:
    return {"input_ids": prompt.input_ids, "attention_mask": torch.ones_like(prompt.input_ids),
            "input_features": prompt.features, "feature_attention_mask": prompt.feature_mask}


@torch.inference_mode()
def _reference_logits(thinker: Thinker, prompt: Prompt) -> torch.Tensor:
    logits: torch.Tensor = thinker(**_reference_inputs(prompt)).logits[0]
    return logits


def _load_lm(family: Path) -> Qwen3MoeForCausalLM:
    lm, info = Qwen3MoeForCausalLM.from_pretrained(family / THINKER_LM, dtype=torch.float32,
                                                   output_loading_info=True)
    assert info["missing_keys"] == info["unexpected_keys"] == set(), info
    loaded: Qwen3MoeForCausalLM = lm.eval()
    return loaded


@torch.inference_mode()
def _lm_logits(lm: Qwen3MoeForCausalLM, prompt: Prompt) -> torch.Tensor:
    logits: torch.Tensor = lm(inputs_embeds=prompt.embeds[None]).logits[0]
    return logits


def test_the_lm_config_carries_every_field_the_decoder_reads(family: Path) -> None:
    release = release_dir(family)
    text, lm = text_config(release), lm_config(release)
    assert lm.architectures == ["Qwen3MoeForCausalLM"] and lm.model_type == "qwen3_moe"
    differing = {f: (getattr(lm, f), getattr(text, f)) for f in READ_FIELDS
                 if getattr(lm, f) != getattr(text, f)}
    assert differing == {}
    assert lm.rope_parameters == {"rope_type": "default",
                                  "rope_theta": text.rope_parameters["rope_theta"]}
    assert lm.sliding_window is None and not hasattr(lm, "shared_expert_intermediate_size")
    written = Qwen3MoeForCausalLM.config_class.from_pretrained(family / THINKER_LM)
    assert {f: getattr(written, f) for f in READ_FIELDS} == {f: getattr(lm, f)
                                                              for f in READ_FIELDS}


@pytest.mark.parametrize(("field", "value", "named"), [
    ("shared_expert_intermediate_size", 64, "a shared expert"),
    ("use_qk_norm", False, "use_qk_norm"),
    ("attention_bias", True, "attention_bias"),
])
def test_a_thinker_no_qwen3_moe_decoder_computes_is_refused(
        family: Path, tmp_path: Path, field: str, value: object, named: str) -> None:
    config = json.loads((release_dir(family) / "config.json").read_text())
    config["thinker_config"]["text_config"][field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=named):
        lm_config(tmp_path)


def test_the_lm_gives_the_thinkers_logits_over_the_same_embeddings(
        family: Path, thinker: Thinker, prompt: Prompt) -> None:
    reference = _reference_logits(thinker, prompt)
    logits = _lm_logits(_load_lm(family), prompt)
    assert logits.shape == reference.shape == (prompt.input_ids.shape[1], TokenIds().vocab_size)
    diff = float((logits - reference).abs().max())
    print_figure(BENCH, "LM logits max |diff| vs the thinker", diff * 1e6, "e-6")
    print_figure(BENCH, "logit spread (std)", float(reference.std()), "")
    assert diff <= LOGITS_ATOL


def _renormalisation_off(lm: Qwen3MoeForCausalLM) -> None:
    for layer in lm.model.layers:
        layer.mlp.gate.norm_topk_prob = False


@pytest.mark.parametrize("breakage", [reset_q_norm, swap_two_experts, _renormalisation_off],
                         ids=["q_norm reset", "two experts swapped", "top-k renormalisation off"])
def test_the_logit_comparison_sees_a_dropped_piece(
        family: Path, thinker: Thinker, prompt: Prompt,
        breakage: Callable[[Qwen3MoeForCausalLM], None]) -> None:
    lm = _load_lm(family)
    with torch.no_grad():
        breakage(lm)
    diff = float((_lm_logits(lm, prompt) - _reference_logits(thinker, prompt)).abs().max())
    print_figure(BENCH, f"{breakage.__name__}: logits max |diff|", diff, "")
    assert diff > BROKEN_FACTOR * LOGITS_ATOL


def test_a_weightless_release_gives_a_weightless_lm_of_the_same_tensors(
        family: Path, tmp_path: Path) -> None:
    """Renamed from the headers: the same names, shapes and dtypes, the data a hole (a
    weightless release is renamed the same way: only headers are read)."""
    write_thinker_lm(release_dir(family), tmp_path, dummy_weights=True)
    assert_weightless_copy(family / THINKER_LM, tmp_path)


@pytest.fixture(scope="module")
async def engine(family: Path) -> AsyncIterator[VllmEngine]:
    """The converted LM on one CPU engine, fed prompt embeddings, no tokenizer."""
    async with embeds_engine(family / THINKER_LM, BENCH) as started:
        yield started


@pytest.mark.engines
async def test_vllm_greedy_tokens_equal_the_thinkers(
        engine: VllmEngine, thinker: Thinker, prompt: Prompt) -> None:
    with torch.inference_mode():
        out = thinker.generate(**_reference_inputs(prompt), max_new_tokens=STEPS,
                               do_sample=False)
    expected = out[0, prompt.input_ids.shape[1]:].tolist()
    assert len(expected) == STEPS
    print_figure(BENCH, "distinct tokens in the reference reply", len(set(expected)), "")
    assert len(set(expected)) > STEPS // 4, "a reply that varies, not one id repeated"
    tokens = await greedy_tokens(engine, "thinker-parity", prompt.embeds, STEPS, BENCH)
    print_figure(BENCH, "prompt rows (audio rows among them)", prompt.embeds.shape[0], "")
    assert tokens == expected, "greedy text tokens identical for all steps"
