"""Qwen3-Omni release directories: the tiny random one we build, and checks on any one.

A release directory has the Hugging Face layout of the published Qwen3-Omni-30B-A3B checkpoints:
config.json (architecture `Qwen3OmniMoeForConditionalGeneration`, model_type `qwen3_omni_moe`),
the safetensors weights of thinker, talker and code2wav (one file, or shards and their index)
and generation_config.json, with the tokenizer, chat_template.json and the audio
preprocessor_config.json (the tiny release's: `tiny_tokenizer`).

The tiny release is transformers' own model class at the sizes of `tiny_config`, with RANDOM
weights from a fixed torch seed: it exercises the real architecture, it says nothing. Three
things make it a deterministic, fair test of code that must compute what the reference computes:

- The talker's routed experts are drawn from the seeded generator (`redraw_talker_experts`):
  transformers 5.19's constructor leaves them as torch.empty made them (its `_init_weights`
  initialises the thinker's experts, `Qwen3OmniMoeThinkerTextExperts`, but not the talker's,
  `Qwen3OmniMoeTalkerTextExperts`), so they held whatever memory was there: zeros or
  denormals that differed from build to build, and the talker's routed branch computed
  nothing.
- Every parameter transformers initialises to a constant (biases at 0; norm weights at 1;
  layer scales at 0.01; the ConvNeXt gammas at 1e-6; SnakeBeta's alpha and beta at 0; the
  talker's routers and shared-expert gates at 0) gets random noise (`perturb_constants`): a
  parity test over zero biases or unit norms cannot see a port that drops one, and a 1e-6
  gamma would hide a whole ConvNeXt branch below any tolerance.
- code2wav's convolutions are redrawn at std gain / sqrt(fan-in) (`code2wav_at_working_gain`):
  at transformers' std of 0.02 each shrinks the signal about 2.5 times and the tiny decoder
  spoke at 2e-6 of full scale, under any float32 tolerance; at gain 1 its residual units grow
  it to about 400 before the last convolution, where SnakeBeta's sines amplified float
  rounding 200-fold (the first 8 frames decoded alone differed from the same frames of a
  40-frame decode by 4.5e-3 of the peak). At `CONV_GAIN` 0.7, `RESIDUAL_GAIN` 0.3 on the
  residual units' last convolution and `INPUT_GAIN` 0.1 on the decoder's first (the
  transformer's states, about 3, brought under 1), the signal peaks between 0.3 and 3 at
  every layer, the audio near 0.45, clear of the reference's clamp at 1 (which would hide
  differences where it bites), and that difference is 5e-7 of the peak.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import Qwen3OmniMoeCode2Wav, Qwen3OmniMoeForConditionalGeneration
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeTalkerTextExperts,
)

from pipeline.families.kit.hf_release import checked_release_config, hearing_files
from pipeline.families.qwen3_omni.tiny_config import ARCHITECTURE, tiny_config
from pipeline.families.qwen3_omni.tiny_tokenizer import write_tiny_tokenizer

ARCHITECTURES = (ARCHITECTURE,)
MODEL_TYPE = "qwen3_omni_moe"
PERTURB_STD = 0.1  # noise on parameters initialised to a constant
CONV_GAIN = 0.7  # code2wav's convolutions: std CONV_GAIN / sqrt(fan-in)
RESIDUAL_GAIN = 0.3  # the residual units' last convolution (a branch added to its input)
INPUT_GAIN = 0.1  # the decoder's first convolution (the transformer's states, about 3)


def write_tiny_release(directory: Path, seed: int) -> None:
    """Write a tiny Qwen3-Omni release (random weights from `seed`) into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(tiny_config()).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    redraw_talker_experts(model, generator)  # first: left uninitialised, they may be constant
    perturb_constants(model, generator)
    code2wav_at_working_gain(model.code2wav, generator)
    model.save_pretrained(directory)
    write_tiny_tokenizer(directory)  # its tokenizer, chat template and audio preprocessor


@torch.no_grad()
def redraw_talker_experts(model: Qwen3OmniMoeForConditionalGeneration,
                          generator: torch.Generator) -> None:
    """Draw the talker's routed experts (each layer's fused `gate_up_proj` and `down_proj`)
    from `generator`, normal at the talker's initializer_range: what transformers draws for
    the thinker's, which its constructor leaves the talker's without."""
    talker: Any = model.config.talker_config  # a sub-config
    std = float(talker.text_config.initializer_range)
    for module in model.talker.modules():
        if isinstance(module, Qwen3OmniMoeTalkerTextExperts):
            for weights in (module.gate_up_proj, module.down_proj):
                weights.copy_(torch.randn(weights.shape, generator=generator) * std)


def constant_parameters(model: nn.Module) -> list[str]:
    """The names of `model`'s parameters whose elements are all equal (as initialised)."""
    found = []
    for name, parameter in model.named_parameters():
        flat = parameter.detach().reshape(-1)
        if flat.numel() and bool((flat == flat[0]).all()):
            found.append(name)
    return found


@torch.no_grad()
def perturb_constants(model: nn.Module, generator: torch.Generator) -> None:
    """Add random noise (normal, PERTURB_STD) to every parameter initialised to a constant."""
    parameters = dict(model.named_parameters())
    for name in constant_parameters(model):
        parameter = parameters[name]
        parameter.add_(torch.randn(parameter.shape, generator=generator) * PERTURB_STD)


@torch.no_grad()
def code2wav_at_working_gain(code2wav: Qwen3OmniMoeCode2Wav, generator: torch.Generator) -> None:
    """Redraw code2wav's convolution weights at std gain / sqrt(fan-in): INPUT_GAIN for the
    decoder's first convolution, RESIDUAL_GAIN for the residual units' last, CONV_GAIN for
    the others."""
    first = code2wav.decoder[0].conv
    for name, module in code2wav.named_modules():
        if not isinstance(module, nn.Conv1d | nn.ConvTranspose1d):
            continue
        weight = module.weight
        if isinstance(module, nn.Conv1d):
            fan_in = weight.shape[1] * weight.shape[2]  # (out, in / groups, kernel)
        else:  # (in, out, kernel): an output sample sums kernel / stride inputs a channel
            fan_in = weight.shape[0] * weight.shape[2] // module.stride[0]
        gain = (INPUT_GAIN if module is first
                else RESIDUAL_GAIN if name.endswith("conv2.conv") else CONV_GAIN)
        weight.copy_(torch.randn(weight.shape, generator=generator) * gain / math.sqrt(fan_in))


def check_release(directory: Path) -> dict:
    """The release's config.json, or a clear error naming what is missing or wrong."""
    return checked_release_config(directory, "Qwen3-Omni",
                                  "download Qwen/Qwen3-Omni-30B-A3B-Instruct there",
                                  MODEL_TYPE, ARCHITECTURES, hearing_files(Path(directory)))
