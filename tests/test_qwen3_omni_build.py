"""The qwen3_omni family's build: a tiny random Qwen3-Omni release, laid out as published.

The release must load in transformers' reference class with every tensor in place, its
random weights must leave nothing at transformers' constant initialisation (zero biases, unit
norms: a parity test over those cannot see a port that drops one), a second build must find
the first one current (`build_support.build_once`), and config.json must carry the published
release's names. The talker's routed experts, which transformers' constructor leaves
uninitialised, are drawn from the seed: the same seed writes the same release, byte for byte.
Beside the release the family holds the thinker's and the talker's LMs (thinker_lm/ and
talker_lm/, checked against the reference in test_qwen3_omni_thinker.py and
test_qwen3_omni_talker_lm.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import Qwen3OmniMoeForConditionalGeneration

from pipeline.families import load_family
from pipeline.families.kit.build_support import read_manifest
from pipeline.families.kit.hf_release import TOKENIZER_FILES
from pipeline.families.kit.release_build import release_dir
from pipeline.families.qwen3_omni.build import (
    FAMILY,
    RECIPE,
    SEED,
    TALKER_LM,
    THINKER_LM,
    build_qwen3_omni,
)
from pipeline.families.qwen3_omni.release import (
    PERTURB_STD,
    check_release,
    constant_parameters,
    write_tiny_release,
)
from pipeline.families.qwen3_omni.tiny_config import (
    ARCHITECTURE,
    CODEBOOK_SIZE,
    TokenIds,
    tiny_config,
)

# Names the published Qwen3-Omni-30B-A3B config.json has, by sub-config (transformers writes the
# text models' rope_theta and rope_scaling as rope_parameters, and the talker's num_experts as
# num_local_experts; it reads either).
PUBLISHED = {
    "": ["architectures", "model_type", "enable_audio_output", "im_start_token_id",
         "im_end_token_id", "tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id",
         "system_token_id", "user_token_id", "assistant_token_id", "thinker_config",
         "talker_config", "code2wav_config"],
    "thinker_config": ["audio_config", "vision_config", "text_config", "audio_start_token_id",
                       "audio_end_token_id", "audio_token_id", "image_token_id",
                       "video_token_id", "vision_start_token_id", "vision_end_token_id",
                       "position_id_per_seconds", "seconds_per_chunk", "user_token_id"],
    "thinker_config.audio_config": ["num_mel_bins", "d_model", "encoder_attention_heads",
                                    "encoder_ffn_dim", "encoder_layers",
                                    "downsample_hidden_size", "output_dim", "n_window",
                                    "n_window_infer"],
    "thinker_config.vision_config": ["depth", "hidden_size", "num_heads", "intermediate_size",
                                     "patch_size", "temporal_patch_size", "spatial_merge_size",
                                     "out_hidden_size", "in_channels",
                                     "deepstack_visual_indexes", "apply_vit_abs_pos_embed",
                                     "tokens_per_second"],
    "thinker_config.text_config": ["num_hidden_layers", "hidden_size", "num_attention_heads",
                                   "num_key_value_heads", "head_dim", "moe_intermediate_size",
                                   "shared_expert_intermediate_size", "num_experts",
                                   "num_experts_per_tok", "norm_topk_prob", "use_qk_norm",
                                   "vocab_size", "max_position_embeddings"],
    "talker_config": ["accept_hidden_layer", "audio_end_token_id", "audio_start_token_id",
                      "audio_token_id", "image_token_id", "video_token_id",
                      "vision_start_token_id", "codec_bos_id", "codec_eos_token_id",
                      "codec_pad_id", "codec_nothink_id", "codec_think_bos_id",
                      "codec_think_eos_id", "num_code_groups", "thinker_hidden_size",
                      "spatial_merge_size", "position_id_per_seconds", "seconds_per_chunk",
                      "speaker_id", "text_config", "code_predictor_config"],
    "talker_config.text_config": ["num_hidden_layers", "hidden_size", "num_attention_heads",
                                  "num_key_value_heads", "head_dim", "moe_intermediate_size",
                                  "shared_expert_intermediate_size", "num_experts_per_tok",
                                  "norm_topk_prob", "vocab_size", "max_position_embeddings"],
    "talker_config.code_predictor_config": ["num_hidden_layers", "hidden_size", "head_dim",
                                            "num_attention_heads", "num_key_value_heads",
                                            "intermediate_size", "vocab_size",
                                            "num_code_groups", "rms_norm_eps"],
    "code2wav_config": ["num_quantizers", "num_semantic_quantizers", "codebook_size",
                        "semantic_codebook_size", "vector_quantization_hidden_dimension",
                        "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "sliding_window",
                        "rms_norm_eps", "layer_scale_initial_scale", "decoder_dim",
                        "upsample_rates", "upsampling_ratios", "max_position_embeddings"],
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    directory = tmp_path_factory.mktemp("models")
    build_qwen3_omni(directory, progress=False)
    return directory


@pytest.fixture(scope="module")
def release(models: Path) -> Path:
    return release_dir(models / FAMILY)


@pytest.fixture(scope="module")
def reference(release: Path) -> Qwen3OmniMoeForConditionalGeneration:
    model, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        release, output_loading_info=True)
    assert info["missing_keys"] == info["unexpected_keys"] == set(), info
    assert info["mismatched_keys"] == set() and info["error_msgs"] == [], info
    loaded: Qwen3OmniMoeForConditionalGeneration = model.eval()
    return loaded


def _part(config: dict[str, Any], path: str) -> dict[str, Any]:
    for name in filter(None, path.split(".")):
        config = config[name]
    return config


def test_the_release_is_laid_out_as_published(release: Path) -> None:
    config = check_release(release)
    assert config["architectures"] == [ARCHITECTURE] == ["Qwen3OmniMoeForConditionalGeneration"]
    assert config["model_type"] == "qwen3_omni_moe"
    missing = [f"{path}.{name}" for path, names in PUBLISHED.items()
               for name in names if name not in _part(config, path)]
    assert missing == []
    assert sorted(p.name for p in release.iterdir()) == [
        "chat_template.json", "config.json", "generation_config.json", "model.safetensors",
        "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json"]
    # experts one by one, as the published checkpoint names them (transformers fuses them on
    # loading, and writes them back apart); what vLLM's loaders read
    with safe_open(release / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    for model in ("thinker", "talker"):
        assert {f"{model}.model.layers.1.mlp.experts.3.{proj}.weight"
                for proj in ("gate_proj", "up_proj", "down_proj")} <= names
    assert "talker.model.layers.0.mlp.shared_expert_gate.weight" in names
    assert "code2wav.decoder.1.block.1.conv.weight" in names


def test_the_tiny_configuration_keeps_the_published_codec(
        reference: Qwen3OmniMoeForConditionalGeneration) -> None:
    config = reference.config
    talker, code2wav = config.talker_config, config.code2wav_config
    # 16 codebooks a frame, 1920 samples a frame, as published
    assert talker.num_code_groups == talker.code_predictor_config.num_code_groups == 16
    assert code2wav.num_quantizers == 16
    assert list(code2wav.upsample_rates) == [8, 5, 4, 3]
    assert list(code2wav.upsampling_ratios) == [2, 2]
    assert talker.code_predictor_config.vocab_size == code2wav.codebook_size == CODEBOOK_SIZE
    # the talker's gated shared expert and the thinker's none, as published
    assert talker.text_config.shared_expert_intermediate_size > 0
    assert config.thinker_config.text_config.shared_expert_intermediate_size == 0
    assert reference.talker.model.layers[0].mlp.experts.gate_up_proj.shape[0] == 4
    # ids as the published layout, inside the tiny vocabularies
    ids = vars(TokenIds())
    vocab = ids.pop("vocab_size")
    assert max(ids.values()) < vocab == config.thinker_config.text_config.vocab_size
    assert max(talker.speaker_id.values()) < talker.text_config.vocab_size
    written = {key: value for key, value in config.to_dict()["code2wav_config"].items()
               if key != "dtype"}
    assert written == {key: value for key, value in tiny_config().to_dict()[
        "code2wav_config"].items() if key != "dtype"}


def test_no_parameter_is_left_at_its_constant_initialisation(
        reference: Qwen3OmniMoeForConditionalGeneration) -> None:
    constant = [name for name in constant_parameters(reference)
                if reference.get_parameter(name).numel() > 1]
    assert constant == []
    biases = {name: p for name, p in reference.named_parameters() if name.endswith(".bias")}
    assert len(biases) > 50
    assert all(bool((p != 0).all()) for p in biases.values())
    norms = [p for name, p in reference.named_parameters()
             if "norm" in name and name.endswith(".weight")]
    assert len(norms) > 20
    spread = float(torch.cat([(p - 1).detach().flatten() for p in norms]).std())
    assert 0.5 * PERTURB_STD < spread < 2 * PERTURB_STD
    assert float(reference.code2wav.upsample[0][1].gamma.detach().abs().max()) > 1e-2  # not 1e-6


def test_every_routed_expert_is_drawn_at_the_initializer_range(
        reference: Qwen3OmniMoeForConditionalGeneration) -> None:
    """The thinker's experts as transformers draws them, the talker's (which its constructor
    leaves as torch.empty made them) the same way: no zeros or denormals in the routed
    branch."""
    std = reference.config.talker_config.text_config.initializer_range
    experts = {name: p.detach() for name, p in reference.named_parameters()
               if ".mlp.experts." in name}
    assert {name.split(".")[0] for name in experts} == {"thinker", "talker"}
    spreads = {name: float(p.std()) for name, p in experts.items()}
    assert all(0.9 * std < spread < 1.1 * std for spread in spreads.values()), spreads
    assert all(bool((p != 0).all()) for p in experts.values())


def test_the_same_seed_writes_the_same_release(release: Path, tmp_path: Path) -> None:
    write_tiny_release(tmp_path, SEED)
    assert (tmp_path / "model.safetensors").read_bytes() == (
        release / "model.safetensors").read_bytes()


def test_the_family_holds_the_release_and_both_lms(models: Path) -> None:
    family = models / FAMILY
    assert sorted(p.name for p in family.iterdir()) == [
        "manifest.json", "release", TALKER_LM, THINKER_LM]
    weights = {"config.json", "generation_config.json", "model.safetensors"}
    tokenizer = {p.name for p in release_dir(family).iterdir()} & set(TOKENIZER_FILES)
    # the thinker's text tokens come with the release's tokenizer; the talker's are codec ids
    assert {p.name for p in (family / THINKER_LM).iterdir()} == weights | tokenizer
    assert {p.name for p in (family / TALKER_LM).iterdir()} == weights
    for lm in (THINKER_LM, TALKER_LM):
        assert json.loads((family / lm / "config.json").read_text())["architectures"] == [
            "Qwen3MoeForCausalLM"]
    listed = read_manifest(family)["files"]
    assert {f"{THINKER_LM}/model.safetensors", f"{TALKER_LM}/model.safetensors",
            "release/config.json"} <= set(listed)


def test_the_talker_lm_holds_the_talkers_text_model_and_codec_head(models: Path) -> None:
    """Every tensor of the talker's text model and its codec head, under the causal LM's
    names, and nothing of the code predictor, the projections or the thinker."""
    family = models / FAMILY
    with safe_open(release_dir(family) / "model.safetensors", "pt") as source:
        talker = {k for k in source.keys()  # noqa: SIM118 (safe_open is no mapping)
                  if k.startswith("talker.model.") or k == "talker.codec_head.weight"}
    with safe_open(family / TALKER_LM / "model.safetensors", "pt") as written:
        names = set(written.keys())
    assert len(names) == len(talker)
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
            "model.layers.1.mlp.shared_expert_gate.weight",
            "model.layers.1.mlp.experts.3.down_proj.weight"} <= names
    assert not any(n.startswith("model.codec_embedding") for n in names)
    config = json.loads((family / TALKER_LM / "config.json").read_text())
    assert config["shared_expert_intermediate_size"] > 0


def test_a_second_build_is_a_no_op_and_the_seed_is_honoured(models: Path) -> None:
    family = models / FAMILY
    weights = release_dir(family) / "model.safetensors"
    lm_weights = family / THINKER_LM / "model.safetensors"
    before = (weights.stat().st_mtime_ns, lm_weights.stat().st_mtime_ns, read_manifest(family))
    assert build_qwen3_omni(models, progress=False) == family
    assert (weights.stat().st_mtime_ns, lm_weights.stat().st_mtime_ns,
            read_manifest(family)) == before
    assert read_manifest(family)["recipe"] == RECIPE and read_manifest(family)["seed"] == SEED
    other = models.parent / f"{models.name}-other"
    rebuilt = build_qwen3_omni(other, progress=False, seed=SEED + 1)
    assert read_manifest(rebuilt)["seed"] == SEED + 1
    assert (release_dir(rebuilt) / "model.safetensors").read_bytes() != weights.read_bytes()


def test_the_family_is_registered_with_its_stages_and_refuses_other_releases(
        tmp_path: Path) -> None:
    assert sorted(load_family(FAMILY).STAGES) == ["talker", "thinker", "voicebox"]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_omni"}))
    with pytest.raises(ValueError, match="not a Qwen3-Omni release"):
        check_release(tmp_path)
