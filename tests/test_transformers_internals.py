"""The transformers internals `pipeline/families/kit/transformers_internals.py` reaches are still
where it looks, checked on the installed transformers with the tiny Qwen2.5-Omni configuration
(no release, no weights): an upgrade that moves one fails here with TransformersInternalsError
naming it, instead of in a worker at run time (its module docstring says why each is used and
what upstream could offer instead)."""

from __future__ import annotations

import inspect
import logging
from functools import cache
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import Qwen2_5OmniConfig, Qwen2_5OmniToken2WavDiTModel, Qwen3OmniMoeCode2Wav

from pipeline.families.kit import transformers_internals
from pipeline.families.kit.transformers_internals import (
    TransformersInternalsError,
    attention_implementation,
    audio_encoder_class,
    block_diff_replaced,
    code2wav_parts,
    feature_lengths,
    model_from_config,
    ode_solver_class,
    qwen3_audio_encoder_class,
)
from pipeline.families.qwen3_omni.tiny_config import tiny_config as qwen3_omni_config
from pipeline.families.qwen25_omni import tiny_tokenizer
from pipeline.families.qwen25_omni.tiny_config import tiny_config

ADAPTER = "pipeline/families/kit/transformers_internals.py"


@cache
def config() -> Qwen2_5OmniConfig:
    return tiny_config(tiny_tokenizer.token_ids(tiny_tokenizer.train_tokenizer()))


def audio_config() -> Any:
    thinker: Any = config().thinker_config
    return thinker.audio_config


def test_the_audio_encoder_is_built_from_its_sub_config_in_a_dtype() -> None:
    encoder_class = audio_encoder_class()
    assert encoder_class.__name__ == "Qwen2_5OmniAudioEncoder"
    for dtype in (torch.float32, torch.bfloat16):
        encoder = model_from_config(encoder_class, audio_config(), dtype=dtype)
        assert isinstance(encoder, encoder_class)
        assert {parameter.dtype for parameter in encoder.parameters()} == {dtype}, (
            f"_from_config no longer builds in the dtype given, which {ADAPTER} relies on")


def test_qwen3_omnis_audio_encoder_is_built_from_its_sub_config_in_a_dtype() -> None:
    encoder_class = qwen3_audio_encoder_class()
    assert encoder_class.__name__ == "Qwen3OmniMoeAudioEncoder"
    thinker: Any = qwen3_omni_config().thinker_config
    encoder = model_from_config(encoder_class, thinker.audio_config, dtype=torch.bfloat16)
    assert isinstance(encoder, encoder_class)
    assert {parameter.dtype for parameter in encoder.parameters()} == {torch.bfloat16}
    frames = torch.tensor([130])  # one whole window of 100 mel frames, and 30 more
    encoded = encoder(torch.zeros(thinker.audio_config.num_mel_bins, 130,
                                  dtype=torch.bfloat16), feature_lens=frames)
    assert encoded.last_hidden_state.shape == (13 + 4, thinker.audio_config.output_dim), (
        "13 rows a whole window, then the rest's frames halved three times")


def test_feature_lengths_are_the_frames_after_convolution_and_pooling() -> None:
    encoder = model_from_config(audio_encoder_class(), audio_config(), dtype=torch.float32)
    frames = torch.tensor([100, 3000, 1])
    after_cnn, rows = feature_lengths(encoder, frames)
    # Whisper's convolutions halve the frames (stride 2), the pooling halves them again:
    # one row per 40 ms of audio (a mel frame is 10 ms).
    assert after_cnn.tolist() == [(n - 1) // 2 + 1 for n in frames.tolist()]
    assert rows.tolist() == [(n - 2) // 2 + 1 for n in after_cnn.tolist()]
    encoded = encoder(torch.zeros(encoder.config.num_mel_bins, int(frames[:2].sum())),
                      feature_lens=frames[:2], aftercnn_lens=after_cnn[:2])
    assert encoded.last_hidden_state.shape[0] == int(rows[:2].sum()), (
        "the encoder no longer yields the rows its _get_feat_extract_output_lengths counts")


def test_the_ode_solver_integrates_as_rk4() -> None:
    solver = ode_solver_class()(function=lambda t, y: y, initial_value=torch.ones(1))
    trajectory = solver.integrate(torch.linspace(0, 1, 11))
    assert abs(float(trajectory[-1]) - torch.e) < 1e-5  # y' = y from 1: e at t = 1


def test_the_dits_forward_builds_its_masks_from_the_block_distances_replaced() -> None:
    source = inspect.getsource(Qwen2_5OmniToken2WavDiTModel.forward)
    assert "self._create_block_diff(" in source, (
        f"Qwen2_5OmniToken2WavDiTModel.forward no longer calls _create_block_diff, which "
        f"{ADAPTER} replaces to mask padded frames")
    token2wav: Any = config().token2wav_config
    dit = Qwen2_5OmniToken2WavDiTModel._from_config(token2wav.dit_config)
    hidden = torch.zeros(2, 5, 8)
    plain = dit._create_block_diff(hidden)
    assert plain.shape == (2, dit.num_attention_heads, 5, 5)
    seen: list[torch.Tensor] = []

    def replace(own: transformers_internals.BlockDiff) -> transformers_internals.BlockDiff:
        def replaced(states: torch.Tensor) -> torch.Tensor:
            seen.append(states)
            return own(states) + 1

        return replaced

    with block_diff_replaced(dit, replace):
        assert torch.equal(dit._create_block_diff(hidden), plain + 1)
    assert seen == [hidden]
    assert "_create_block_diff" not in vars(dit), "the instance keeps no replacement after"
    assert torch.equal(dit._create_block_diff(hidden), plain)


def test_code2wavs_layers_are_the_parts_found_and_as_causal_as_streamed() -> None:
    parts = code2wav_parts()
    code2wav = Qwen3OmniMoeCode2Wav(qwen3_omni_config().code2wav_config).eval()
    upsample, convnext = code2wav.upsample[0]
    first, block, snake = code2wav.decoder[0], code2wav.decoder[1], code2wav.decoder[-2]
    unit = block.block[2]
    assert isinstance(upsample, parts.transposed_conv) and isinstance(convnext, parts.convnext)
    assert isinstance(first, parts.causal_conv) and isinstance(snake, parts.snake)
    assert isinstance(block.block[1], parts.transposed_conv)
    assert isinstance(unit, parts.residual_unit)
    # what the streaming renderer reads inside them
    assert {"dwconv", "norm", "pwconv1", "act", "pwconv2", "gamma"} <= set(dir(convnext))
    assert {"act1", "conv1", "act2", "conv2"} <= set(dir(unit))
    # a causal convolution pads (kernel - 1) * dilation zeros on the left, none on the right
    samples = torch.randn(1, unit.conv1.conv.in_channels, 40)
    context = (unit.conv1.conv.kernel_size[0] - 1) * unit.conv1.conv.dilation[0]
    with torch.no_grad():
        padded = unit.conv1.conv(torch.nn.functional.pad(samples, (context, 0)))
        assert torch.allclose(unit.conv1(samples), padded, atol=1e-6), (
            f"{ADAPTER}'s streamed code2wav keeps (kernel - 1) * dilation inputs as context")
        # a transposed convolution of kernel K, stride s is trimmed K - s samples each side
        transposed = block.block[1]
        kernel, stride = transposed.conv.kernel_size[0], transposed.conv.stride[0]
        samples = torch.randn(1, transposed.conv.in_channels, 10)
        raw = transposed.conv(samples)
        assert torch.equal(transposed(samples), raw[..., kernel - stride: raw.shape[-1] - (
            kernel - stride)])


def test_a_moved_code2wav_part_fails_loudly_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    module = transformers_internals.qwen3_omni_modeling()
    monkeypatch.delattr(module, "Qwen3OmniMoeSnakeBeta")
    with pytest.raises(TransformersInternalsError, match=r"Qwen3OmniMoeSnakeBeta"):
        code2wav_parts()


def test_a_moved_private_fails_loudly_naming_it() -> None:
    with pytest.raises(TransformersInternalsError, match=r"_get_feat_extract_output_lengths"):
        feature_lengths(torch.nn.Linear(1, 1), torch.tensor([10]))
    linear = torch.nn.Linear(1, 1)
    with (pytest.raises(TransformersInternalsError,
                        match=r"Qwen2_5OmniToken2WavDiTModel\._create_block_diff"),
          block_diff_replaced(linear, lambda plain: plain)):
        pass
    with pytest.raises(TransformersInternalsError, match=r"Linear\._from_config"):
        model_from_config(torch.nn.Linear, SimpleNamespace())
    with pytest.raises(TransformersInternalsError,
                       match=r"SimpleNamespace\._attn_implementation"):
        attention_implementation(SimpleNamespace())


def test_a_built_models_attention_kernel_is_read_from_its_configuration() -> None:
    config = qwen3_omni_config().code2wav_config
    for kernel in ("eager", "sdpa"):
        built = Qwen3OmniMoeCode2Wav._from_config(config, attn_implementation=kernel)
        assert attention_implementation(built.config) == kernel


def test_another_release_is_noted_once(monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(transformers_internals.REACH, "version", lambda: "9.0.0")
    monkeypatch.setattr(transformers_internals.REACH, "noted", False)
    with caplog.at_level(logging.WARNING, logger=transformers_internals.__name__):
        audio_encoder_class()
        audio_encoder_class()
    noted = [r for r in caplog.records if "written for" in r.getMessage()]
    assert len(noted) == 1 and "9.0.0" in noted[0].getMessage()

