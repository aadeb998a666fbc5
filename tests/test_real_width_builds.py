"""`omnivox models build PROFILE --real-widths DIR`: the published models' widths with the
layers cut, checked on the meta device (no weights written here: a real-width checkpoint is
3.9 GB; tests/test_real_width_calls.py writes and serves them in `make soak`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import Qwen2_5OmniForConditionalGeneration

from agent.cli import main
from pipeline.families.kit.dummy_weights import meta_tensors, parameter_count
from pipeline.families.qwen3_omni import real_size as qwen3_size
from pipeline.families.qwen3_omni import real_widths as qwen3_widths
from pipeline.families.qwen3_omni import tiny_tokenizer as qwen3_tokenizer
from pipeline.families.qwen25_omni.real_size import real_config
from pipeline.families.qwen25_omni.real_widths import real_width_config

WIDTHS = {
    "thinker_config.text_config": ("hidden_size", "intermediate_size", "num_attention_heads",
                                   "num_key_value_heads", "vocab_size"),
    "thinker_config.audio_config": ("d_model", "encoder_ffn_dim", "encoder_attention_heads",
                                    "num_mel_bins", "output_dim"),
    "talker_config": ("hidden_size", "intermediate_size", "num_attention_heads",
                      "num_key_value_heads", "head_dim", "vocab_size", "embedding_size"),
    "token2wav_config.dit_config": ("hidden_size", "num_attention_heads", "head_dim",
                                    "num_embeds", "mel_dim", "block_size"),
    "token2wav_config.bigvgan_config": ("upsample_initial_channel", "upsample_rates"),
}


def _part(config: object, path: str) -> object:
    for name in path.split("."):
        config = getattr(config, name)
    return config


def test_every_width_is_the_published_ones_and_every_stack_is_cut() -> None:
    real, cut = real_config(), real_width_config(layers=1)
    for path, names in WIDTHS.items():
        for name in names:
            ours, published = getattr(_part(cut, path), name), getattr(_part(real, path), name)
            assert ours == published or list(ours) == list(published), name  # lists or tuples
    assert (cut.talker_config.hidden_size, cut.talker_config.num_attention_heads,
            cut.talker_config.head_dim) == (896, 12, 128)
    assert cut.thinker_config.text_config.num_hidden_layers == 1
    assert cut.thinker_config.audio_config.encoder_layers == 1
    assert cut.talker_config.num_hidden_layers == 1
    assert cut.token2wav_config.dit_config.num_hidden_layers == 2
    assert cut.architectures == ["Qwen2_5OmniModel"]


def test_one_layer_a_stack_is_two_billion_parameters() -> None:
    tensors = meta_tensors(lambda: Qwen2_5OmniForConditionalGeneration(real_width_config(1)))
    assert 1.9e9 < parameter_count(tensors) < 2.0e9  # measured 1.953B
    two = meta_tensors(lambda: Qwen2_5OmniForConditionalGeneration(real_width_config(2)))
    assert parameter_count(two, "thinker.model.") > parameter_count(tensors, "thinker.model.")


@pytest.mark.parametrize(("args", "expected"), [
    (["tiny"], "tiny: no real-width checkpoint to write"),
    (["omni", "--layers", "0"], "--layers: at least 1, got 0"),
    (["qwen3-omni", "--layers", "0"], "--layers: at least 1, got 0"),
    (["no-such-profile"], "family name 'no-such-profile'"),
])
def test_real_widths_refusals(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                              args: list[str], expected: str) -> None:
    code = main(["models", "build", *args, "--real-widths", str(tmp_path / "out"),
                 "--models-dir", str(tmp_path / "models")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and expected in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("profile", ["omni", "qwen3-omni"])
def test_real_widths_refuses_a_directory_in_use(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path, profile: str) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    code = main(["models", "build", profile, "--real-widths", str(tmp_path / "out")])
    assert code == 2 and "is not empty" in capsys.readouterr().err


# Qwen3-Omni-30B-A3B (the qwen3_omni family): each part's widths, by config path.
QWEN3_WIDTHS = {
    "thinker_config.text_config": (
        "hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads",
        "num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok", "vocab_size"),
    "thinker_config.audio_config": ("d_model", "encoder_ffn_dim", "encoder_attention_heads",
                                    "num_mel_bins", "downsample_hidden_size", "output_dim"),
    "thinker_config.vision_config": ("hidden_size", "intermediate_size", "num_heads",
                                     "patch_size", "out_hidden_size", "num_position_embeddings"),
    "talker_config": ("thinker_hidden_size", "num_code_groups"),
    "talker_config.text_config": (
        "hidden_size", "intermediate_size", "moe_intermediate_size",
        "shared_expert_intermediate_size", "num_attention_heads", "num_key_value_heads",
        "head_dim", "num_experts", "num_experts_per_tok", "vocab_size"),
    "talker_config.code_predictor_config": ("hidden_size", "intermediate_size",
                                            "num_attention_heads", "num_key_value_heads",
                                            "head_dim", "vocab_size", "num_code_groups"),
    "code2wav_config": ("hidden_size", "intermediate_size", "num_attention_heads",
                        "num_key_value_heads", "codebook_size", "num_quantizers", "decoder_dim",
                        "sliding_window", "upsample_rates", "upsampling_ratios"),
}
# Each stack's layer count, by config path.
QWEN3_STACKS = {"thinker_config.text_config": "num_hidden_layers",
                "thinker_config.audio_config": "encoder_layers",
                "thinker_config.vision_config": "depth",
                "talker_config.text_config": "num_hidden_layers",
                "talker_config.code_predictor_config": "num_hidden_layers",
                "code2wav_config": "num_hidden_layers"}


def test_qwen3_omni_is_the_published_release() -> None:
    real = qwen3_size.real_config()
    text = _part(real, "thinker_config.text_config")
    assert (text.num_hidden_layers, text.hidden_size, text.num_experts,
            text.vocab_size) == (48, 2048, 128, 152064)
    assert text.rope_parameters["mrope_section"] == [24, 20, 20]
    assert real.talker_config.accept_hidden_layer == 24
    assert real.talker_config.speaker_id == {
        "chelsie": 2301, "ethan": 2302, "aiden": 2303}
    sizes = qwen3_size.part_sizes(qwen3_size.release_tensors(real))
    assert sizes["total"] == 35_259_818_545  # the published checkpoint's count
    assert 30.5e9 < sizes["thinker LM"] < 30.6e9


def test_qwen3_omni_keeps_every_width_and_cuts_every_stack() -> None:
    real, cut = qwen3_size.real_config(), qwen3_widths.real_width_config(layers=1)
    for path, names in QWEN3_WIDTHS.items():
        for name in names:
            ours, published = getattr(_part(cut, path), name), getattr(_part(real, path), name)
            assert ours == published or list(ours) == list(published), (path, name)
    for path, name in QWEN3_STACKS.items():
        assert getattr(_part(real, path), name) > 1, path
        assert getattr(_part(cut, path), name) == 1, path
    assert cut.thinker_config.vision_config.deepstack_visual_indexes == [0]
    assert cut.talker_config.accept_hidden_layer == 1
    assert cut.architectures == ["Qwen3OmniMoeForConditionalGeneration"]
    assert qwen3_widths.deepstack_indexes(27) == [8, 16, 24]
    assert qwen3_widths.deepstack_indexes(2) == [0, 1]
    with pytest.raises(ValueError, match="at least 1"):
        qwen3_widths.real_width_config(0)


def test_qwen3_omni_ids_are_the_tiny_tokenizers() -> None:
    cut = qwen3_widths.real_width_config(layers=1)
    tokenizer = qwen3_tokenizer.train_tokenizer()
    thinker = cut.thinker_config
    for token, named in [(qwen3_tokenizer.AUDIO, thinker.audio_token_id),
                         (qwen3_tokenizer.AUDIO_START, thinker.audio_start_token_id),
                         (qwen3_tokenizer.IM_START, cut.im_start_token_id),
                         ("<tts_text_bos>", cut.tts_bos_token_id)]:
        assert tokenizer.token_to_id(token) == named, token


def test_qwen3_omni_one_layer_a_stack_is_1_7_billion_parameters() -> None:
    one = qwen3_size.part_sizes(qwen3_size.release_tensors(qwen3_widths.real_width_config(1)))
    assert one["total"] == 1_741_237_009  # measured; 3.48 GB in bfloat16
    assert one["thinker LM"] > 1.2e9  # one layer of 128 experts, 152064 rows in and out
    two = qwen3_size.part_sizes(qwen3_size.release_tensors(qwen3_widths.real_width_config(2)))
    assert all(two[part] > one[part] for part in qwen3_size.PARTS)


def test_qwen3_omni_real_widths_are_written_by_the_family(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI hands the profile's family writer its directory, layers and seed (the writer
    itself is left out: it takes about 30 s and writes 3.5 GB)."""
    import pipeline.families.qwen3_omni as family

    calls: list[tuple[Path, int, int]] = []
    monkeypatch.setattr(family, "write_real_widths", lambda *args: calls.append(args))
    code = main(["models", "build", "qwen3-omni", "--real-widths", str(tmp_path / "out"),
                 "--layers", "2", "--seed", "5"])
    assert code == 0 and calls == [(tmp_path / "out", 2, 5)]
    assert "omnivox: done" in capsys.readouterr().out
