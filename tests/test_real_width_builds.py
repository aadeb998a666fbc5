"""`omnivox models build PROFILE --real-widths DIR`: the published models' widths with the
layers cut, checked on the meta device (no weights written here: a real-width checkpoint is
3.9 GB; tests/test_real_width_calls.py writes and serves them in `make soak`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import Qwen2_5OmniForConditionalGeneration

from agent.cli import main
from pipeline.families.kit.dummy_weights import meta_tensors, parameter_count
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
])
def test_real_widths_refusals(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                              args: list[str], expected: str) -> None:
    code = main(["models", "build", *args, "--real-widths", str(tmp_path / "out"),
                 "--models-dir", str(tmp_path / "models")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and expected in err and len(err.splitlines()) == 1, err


def test_real_widths_refuses_a_directory_in_use(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    code = main(["models", "build", "omni", "--real-widths", str(tmp_path / "out")])
    assert code == 2 and "is not empty" in capsys.readouterr().err
