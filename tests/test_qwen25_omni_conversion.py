"""The qwen25_omni converters against transformers' reference modules, in torch, no engines.

The thinker's LM (`thinker_lm.py`) and the talker (`talker_lm.py`) are rewritten as plain
causal LMs for vLLM. Loaded back with transformers (`AutoModelForCausalLM`: a Qwen2 with the
config's head_dim), each must compute the reference's logits: the thinker's over text ids, the
talker's over codec ids once its side input is the text-pad row (`talker_lm`'s identity). The
tiny release has RANDOM weights and random non-zero Linear biases (`release.random_biases`), so
a converter that drops a bias changes the logits, and the last tests show that it is caught.
The talker is also converted at the real release's widths (896 wide, 12 heads of 128, 4 KV
heads, a 3584-wide thinker side; one layer, random weights), the head layout that transformers'
LlamaConfig refuses; and the thinker's LM at its real widths (3584 wide, 28 heads, 4 KV heads;
one layer, random weights and biases, the tiny vocabulary).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    Qwen2_5OmniConfig,
    Qwen2_5OmniForConditionalGeneration,
    Qwen2_5OmniTalkerConfig,
    Qwen2_5OmniTalkerForConditionalGeneration,
    Qwen2_5OmniThinkerForConditionalGeneration,
)

from pipeline.families.kit.hf_release import TOKENIZER_FILES
from pipeline.families.qwen25_omni.real_size import REAL_TALKER
from pipeline.families.qwen25_omni.release import (
    ARCHITECTURE,
    ARCHITECTURES,
    BIAS_STD,
    check_release,
    random_biases,
    write_tiny_release,
)
from pipeline.families.qwen25_omni.talker_lm import convert_talker
from pipeline.families.qwen25_omni.thinker_lm import write_thinker_lm

# max |logit difference|; measured 0.0 (thinker) and 3.6e-7 (talker), float32. A dropped bias
# moved the logits by 9.9e-3 (thinker q_proj), 0.29 (thinker v_proj), 0.21 (talker v_proj); a
# dropped k_proj bias moves them least (4e-5: it shifts a query's scores nearly alike), which
# the bias inventory test catches instead.
TOLERANCE = 1e-5
IDS = [5, 17, 33, 60, 12, 99, 41, 7, 250, 3]
CODES = [0, 7, 255, 31, 128, 64, 9, 200]
SEED = 11
# Qwen2.5-Omni-7B's thinker text model (its config.json), one layer of it.
REAL_THINKER_TEXT = {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
                     "num_key_value_heads": 4, "num_hidden_layers": 1}


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("omni-release")
    write_tiny_release(directory, SEED)
    return directory


@pytest.fixture(scope="module")
def reference(release: Path) -> Qwen2_5OmniForConditionalGeneration:
    return Qwen2_5OmniForConditionalGeneration.from_pretrained(release,
                                                               dtype=torch.float32).eval()


def _positions(n: int) -> torch.Tensor:
    """M-RoPE positions of a text-only sequence: the three components equal, 0..n-1."""
    return torch.arange(n).view(1, 1, n).expand(3, 1, n)


@torch.no_grad()
def _lm_logits(directory: Path, ids: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    return model(input_ids=torch.tensor([ids])).logits[0]


@torch.no_grad()
def _thinker_logits(model: Qwen2_5OmniForConditionalGeneration, ids: list[int]) -> torch.Tensor:
    out = model.thinker(input_ids=torch.tensor([ids]), position_ids=_positions(len(ids)))
    return out.logits[0]


@torch.no_grad()
def _talker_logits(talker: Qwen2_5OmniTalkerForConditionalGeneration, pad_row: torch.Tensor,
                   codes: list[int]) -> torch.Tensor:
    """The reference talker's logits over `codes` with the text-pad row as every side input
    (positions given: its prefill's own additions of codec pad and bos do not apply)."""
    rows = talker.get_input_embeddings()(torch.tensor(codes)) + pad_row
    out = talker(inputs_embeds=rows[None], position_ids=_positions(len(codes)))
    return out.logits[0]


def _thinker_error(reference: Qwen2_5OmniForConditionalGeneration, lm_dir: Path) -> float:
    return float((_lm_logits(lm_dir, IDS) - _thinker_logits(reference, IDS)).abs().max())


def _talker_error(talker: Qwen2_5OmniTalkerForConditionalGeneration, pad_row: torch.Tensor,
                  lm_dir: Path) -> float:
    want = _talker_logits(talker, pad_row, CODES)
    return float((_lm_logits(lm_dir, CODES) - want).abs().max())


def _pad_row(model: Qwen2_5OmniForConditionalGeneration) -> torch.Tensor:
    pad = model.talker.config.tts_text_pad_token_id
    return model.thinker.get_input_embeddings().weight[pad].detach()


def _drop(lm_dir: Path, name: str) -> None:
    """What a converter that loses one tensor writes: the LM without it."""
    path = lm_dir / "model.safetensors"
    tensors = load_file(path)
    del tensors[name]
    save_file(tensors, path, metadata={"format": "pt"})


def test_the_tiny_release_is_laid_out_as_published(release: Path) -> None:
    config = json.loads((release / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE] == ["Qwen2_5OmniModel"]
    talker = config["talker_config"]
    assert talker["num_attention_heads"] * talker["head_dim"] != talker["hidden_size"]
    assert set(ARCHITECTURES) == {"Qwen2_5OmniModel", "Qwen2_5OmniForConditionalGeneration"}


def test_every_linear_bias_is_random(reference: Qwen2_5OmniForConditionalGeneration) -> None:
    biases = [m.bias for m in reference.modules()
              if isinstance(m, torch.nn.Linear) and m.bias is not None]
    assert len(biases) > 50
    assert all(float(b.detach().abs().max()) > 0 for b in biases)
    spread = float(torch.cat([b.detach().flatten() for b in biases]).std())
    assert 0.5 * BIAS_STD < spread < 2 * BIAS_STD
    q_bias = reference.thinker.model.layers[0].self_attn.q_proj.bias
    assert float(q_bias.abs().max()) > 0.1  # the bias the converters must carry over


def test_the_thinker_lm_computes_the_reference_thinker(
        release: Path, reference: Qwen2_5OmniForConditionalGeneration, tmp_path: Path) -> None:
    write_thinker_lm(release, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is False
    assert _thinker_error(reference, tmp_path) < TOLERANCE


def test_the_talker_lm_computes_the_reference_talker(
        release: Path, reference: Qwen2_5OmniForConditionalGeneration, tmp_path: Path) -> None:
    convert_talker(release, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["architectures"], config["model_type"]) == (["LlamaForCausalLM"], "qwen2")
    assert _talker_error(reference.talker, _pad_row(reference), tmp_path) < TOLERANCE


@pytest.mark.parametrize("name", ["model.layers.0.self_attn.q_proj.bias",
                                  "model.layers.1.self_attn.v_proj.bias"])
def test_a_thinker_converter_that_drops_a_bias_fails(
        release: Path, reference: Qwen2_5OmniForConditionalGeneration, tmp_path: Path,
        name: str) -> None:
    write_thinker_lm(release, tmp_path)
    _drop(tmp_path, name)
    assert _thinker_error(reference, tmp_path) > 100 * TOLERANCE


def test_a_talker_converter_that_drops_a_bias_fails(
        release: Path, reference: Qwen2_5OmniForConditionalGeneration, tmp_path: Path) -> None:
    convert_talker(release, tmp_path)
    _drop(tmp_path, "model.layers.0.self_attn.v_proj.bias")
    assert _talker_error(reference.talker, _pad_row(reference), tmp_path) > 100 * TOLERANCE


def test_every_bias_is_carried_over(release: Path, tmp_path: Path) -> None:
    """Each LM's biases are the release's, by name and value (k_proj's included)."""
    write_thinker_lm(release, tmp_path / "thinker")
    convert_talker(release, tmp_path / "talker")
    tensors = load_file(release / "model.safetensors")
    for lm, prefix in (("thinker", "thinker."), ("talker", "talker.")):
        converted = load_file(tmp_path / lm / "model.safetensors")
        biases = {name.removeprefix(prefix): tensor for name, tensor in tensors.items()
                  if name.startswith(prefix + "model.layers.") and name.endswith("_proj.bias")}
        assert len(biases) == 6  # q, k, v in each of two layers
        for name, tensor in biases.items():
            assert torch.equal(converted[name], tensor), f"{lm}: {name}"


def test_a_tied_thinker_converts_tied(release: Path, tmp_path: Path) -> None:
    """A release whose thinker ties lm_head to its embedding (config says so, no lm_head
    tensor, as a tied checkpoint is saved) converts to a tied LM computing the same."""
    tied = tmp_path / "tied"
    tied.mkdir()
    for path in release.iterdir():
        (tied / path.name).write_bytes(path.read_bytes())
    config = json.loads((tied / "config.json").read_text())
    config["thinker_config"]["text_config"]["tie_word_embeddings"] = True
    (tied / "config.json").write_text(json.dumps(config))
    _drop(tied, "thinker.lm_head.weight")
    check_release(tied)
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(release, dtype=torch.float32)
    model.thinker.lm_head.weight = model.thinker.model.embed_tokens.weight  # what tied means
    write_thinker_lm(tied, tmp_path / "lm")
    assert json.loads((tmp_path / "lm" / "config.json").read_text())["tie_word_embeddings"]
    assert _thinker_error(model.eval(), tmp_path / "lm") < TOLERANCE

    config["thinker_config"]["text_config"]["tie_word_embeddings"] = False
    (tied / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"lacks thinker\.lm_head\.weight"):
        check_release(tied)


def _real_width_talker_release(directory: Path) -> tuple[
        Qwen2_5OmniTalkerForConditionalGeneration, torch.Tensor]:
    """A release holding a talker at the real widths, one layer, random weights and biases,
    and a 3584-wide thinker embedding of a small vocabulary (the talker reads three rows)."""
    thinker_hidden, vocab = 3584, 64
    text_ids = {"tts_text_start_token_id": 60, "tts_text_end_token_id": 61,
                "tts_text_pad_token_id": 62}
    config = Qwen2_5OmniTalkerConfig(**(REAL_TALKER | {"num_hidden_layers": 1}),
                                     embedding_size=thinker_hidden, **text_ids)
    torch.manual_seed(SEED)
    talker = Qwen2_5OmniTalkerForConditionalGeneration(config).eval()
    random_biases(talker, torch.Generator().manual_seed(SEED))
    thinker_embed = torch.randn(vocab, thinker_hidden) * 0.02
    tensors = {f"talker.{k}": v.contiguous() for k, v in talker.state_dict().items()}
    tensors["thinker.model.embed_tokens.weight"] = thinker_embed
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps({"talker_config": config.to_dict()}))
    torch.save({"Chelsie": {"bos_token": 63}}, directory / "spk_dict.pt")
    return talker, thinker_embed[text_ids["tts_text_pad_token_id"]]


def test_the_talker_converts_at_the_real_release_widths(tmp_path: Path) -> None:
    release, lm_dir = tmp_path / "release", tmp_path / "lm"
    release.mkdir()
    talker, pad_row = _real_width_talker_release(release)
    convert_talker(release, lm_dir)
    config = json.loads((lm_dir / "config.json").read_text())
    assert (config["hidden_size"], config["num_attention_heads"], config["head_dim"],
            config["num_key_value_heads"]) == (896, 12, 128, 4)
    assert _talker_error(talker, pad_row, lm_dir) < TOLERANCE


def _real_width_thinker_release(release: Path, directory: Path) -> torch.nn.Module:
    """`release` with its thinker at the real text widths (3584 wide, 28 heads of 128, 4 KV
    heads, 18944 MLP; one layer, random weights and biases; the tiny vocabulary, the audio
    tower one layer of its real width projecting to 3584), its tokenizer files alongside."""
    settings = Qwen2_5OmniConfig.from_pretrained(release).to_dict()
    thinker_settings = settings["thinker_config"]
    thinker_settings["text_config"].pop("layer_types", None)  # one per layer: derived anew
    thinker_settings["text_config"].update(REAL_THINKER_TEXT)
    thinker_settings["text_config"]["rope_parameters"]["mrope_section"] = [16, 24, 24]  # 7B's
    thinker_settings["audio_config"].update(encoder_layers=1,
                                            output_dim=REAL_THINKER_TEXT["hidden_size"])
    config = Qwen2_5OmniConfig.from_dict(settings)
    torch.manual_seed(SEED)
    thinker = Qwen2_5OmniThinkerForConditionalGeneration(config.thinker_config).eval()
    random_biases(thinker, torch.Generator().manual_seed(SEED))
    directory.mkdir()
    tensors = {f"thinker.{k}": v.contiguous() for k, v in thinker.state_dict().items()}
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    config.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        if (release / name).is_file():
            shutil.copyfile(release / name, directory / name)
    return thinker


def test_the_thinker_converts_at_the_real_release_widths(release: Path, tmp_path: Path) -> None:
    thinker = _real_width_thinker_release(release, tmp_path / "release")
    write_thinker_lm(tmp_path / "release", tmp_path / "lm")
    config = json.loads((tmp_path / "lm" / "config.json").read_text())
    assert {key: config[key] for key in REAL_THINKER_TEXT} == REAL_THINKER_TEXT
    with torch.no_grad():
        want = thinker(input_ids=torch.tensor([IDS]), position_ids=_positions(len(IDS))).logits[0]
    error = float((_lm_logits(tmp_path / "lm", IDS) - want).abs().max())
    print(f"\n[qwen25-omni-conversion] real-width thinker LM max |logit diff|: {error:.2e}")
    assert error < TOLERANCE
