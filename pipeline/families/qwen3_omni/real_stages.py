"""Qwen3-Omni-30B-A3B as the qwen3_omni stages hold it on a GPU: each stage's parts and their
weight memory, and a weightless release of it (what `omnivox bench gpu` serves).

What each stage holds (`stage_sizes`, by release prefix; the vision encoder is never loaded):

- Thinker: the thinker's LM on vLLM (`thinker.model.*`, `thinker.lm_head.*`: 30.5B); in its
  worker the torch copy of the LM's first `accept_hidden_layer` layers and its embedding table
  for the Talker's rows (`thinker_rows.py`: 24 of 48 layers, 15.3B), the audio encoder (0.65B)
  and the talker's two projections (13M, applied in the Thinker's worker).
- Talker: the talker's LM on vLLM as a pooling model (`talker.model.*`, `talker.codec_head.*`:
  3.2B); in its worker the code predictor (0.14B), the codec embedding (its own copy) and the
  codec head.
- VoiceBox: code2wav (0.22B).

Weight memory (`lm_weight_bytes`): bfloat16, two bytes a parameter; with one of vLLM's online
FP8 quantizations (`FP8_ONLINE`: `EngineSettings.quantization`) an LM's attention projections,
routed experts and shared expert weigh one byte a parameter, as vLLM 0.32's online methods
hold them (online/fp8.py: `LinearBase` layers and the fused MoE experts), and its embedding,
head, norms, routers and the shared expert's gate stay bfloat16. The scales (one float32 per
tensor or channel, per 128 x 128 block for `fp8_per_block`) are left out: under 0.01% of it.

The weightless release (`write_dummy_release`) has the published configuration
(`real_size.real_config`) with the tiny tokenizer's special ids, which lie inside the real
vocabulary (the real tokenizer cannot be downloaded here: the same as `real_widths.py`), the
tiny release's tokenizer, chat template and audio preprocessor, and sparse safetensors shards
(`kit/dummy_weights.py`: all zeros, no disk) under the published tensor names: transformers 5.19
holds each MoE layer's experts fused (`mlp.experts.gate_up_proj` (experts, 2 x width, hidden),
`mlp.experts.down_proj`), the release names them one by one
(`mlp.experts.<e>.gate_proj.weight`, `up_proj`, `down_proj`), which `published_tensors` does.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3OmniMoeConfig

from pipeline.families.kit.dummy_weights import (
    part_sizes,
    write_sparse_checkpoint,
)
from pipeline.families.qwen3_omni.real_size import THINKER_VOCAB, real_config, release_tensors
from pipeline.families.qwen3_omni.tiny_config import TokenIds
from pipeline.families.qwen3_omni.tiny_tokenizer import write_tiny_tokenizer

THINKER_LM = ("thinker.model.", "thinker.lm_head.")
TALKER_LM = ("talker.model.", "talker.codec_head.")
# vLLM 0.32's online FP8 quantizations (pipeline/engines/vllm.py `ONLINE_QUANTIZATIONS`)
FP8_ONLINE = ("fp8_per_tensor", "fp8_per_block", "fp8_per_channel")
# The tensors those hold in FP8: attention projections, routed and shared experts.
_FP8_HELD = re.compile(r"\.self_attn\.[qkvo]_proj\.weight$|\.mlp\.experts\."
                       r"|\.mlp\.shared_expert\.(gate|up|down)_proj\.weight$")
_FUSED_EXPERTS = re.compile(r"^(?P<layer>.*\.mlp\.experts)\.(?P<kind>gate_up_proj|down_proj)$")


def stage_parts(config: Qwen3OmniMoeConfig) -> dict[str, dict[str, tuple[str, ...]]]:
    """What each stage holds, part by part, as release prefixes (the module's docstring). The
    key of the Thinker's torch copy of the LM's first layers says "states"."""
    talker: Any = config.talker_config  # a sub-config
    states = ("thinker.model.embed_tokens.",
              *(f"thinker.model.layers.{i}." for i in range(int(talker.accept_hidden_layer))))
    return {
        "thinker": {"thinker LM (vLLM)": THINKER_LM,
                    "thinker LM first layers, states (torch)": states,
                    "audio tower (torch)": ("thinker.audio_tower.",),
                    "talker projections (torch)": ("talker.text_projection.",
                                                   "talker.hidden_projection.")},
        "talker": {"talker LM (vLLM)": TALKER_LM,
                   "code predictor, codec head (torch)": ("talker.code_predictor.",
                                                          "talker.model.codec_embedding.",
                                                          "talker.codec_head.")},
        "voicebox": {"code2wav (torch)": ("code2wav.",)},
    }


def stage_sizes(config: Qwen3OmniMoeConfig, tensors: dict[str, torch.Tensor],
                states_bytes: int = 2) -> dict[str, Any]:
    """Per stage and part: parameters and weight memory in bytes (bfloat16, as the qwen3-omni
    profile places them on a GPU; the Thinker's torch copy of the LM's first layers at
    `states_bytes` a parameter)."""
    return part_sizes(tensors, stage_parts(config), states_bytes)


def lm_weight_bytes(tensors: dict[str, torch.Tensor], prefixes: tuple[str, ...],
                    quantization: str | None = None) -> int:
    """The weight memory of the LM under `prefixes` as vLLM holds it: bfloat16, or with an
    online FP8 `quantization` (the module's docstring)."""
    if quantization is not None and quantization not in FP8_ONLINE:
        raise ValueError(f"quantization {quantization!r}: sized for none or one of "
                         f"{', '.join(FP8_ONLINE)}")
    total = 0
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and name.startswith(prefixes):
            fp8 = quantization is not None and _FP8_HELD.search(name) is not None
            total += tensor.numel() * (1 if fp8 else 2)
    return total


def kv_bytes_per_token(text: Any) -> int:
    """A text model's KV cache per token in bfloat16: keys and values of every layer."""
    return int(text.num_hidden_layers) * 2 * int(text.num_key_value_heads) * int(
        text.head_dim) * 2


def published_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict (meta tensors) under the release's names: every fused MoE experts tensor
    split into the experts' own (the module's docstring); the rest as it is."""
    published: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        fused = _FUSED_EXPERTS.match(name)
        if fused is None:
            published[name] = tensor
            continue
        experts, rows, columns = tensor.shape
        for expert in range(experts):
            prefix = f"{fused['layer']}.{expert}"
            if fused["kind"] == "down_proj":
                published[f"{prefix}.down_proj.weight"] = tensor.new_empty(rows, columns)
            else:  # gate and up stacked: (2 x width, hidden)
                for half in ("gate_proj", "up_proj"):
                    published[f"{prefix}.{half}.weight"] = tensor.new_empty(rows // 2, columns)
    return published


def dummy_config() -> Qwen3OmniMoeConfig:
    """The published configuration with the tiny tokenizer's special ids (inside the real
    vocabulary), stored in bfloat16 as published."""
    config = real_config(TokenIds(vocab_size=THINKER_VOCAB))
    config.dtype = torch.bfloat16
    return config


def write_dummy_release(directory: Path) -> dict[str, torch.Tensor]:
    """Write a weightless Qwen3-Omni-30B-A3B release into `directory`; its tensors as the
    release names them (meta)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = dummy_config()
    tensors = published_tensors(release_tensors(config))
    config.save_pretrained(directory)
    write_sparse_checkpoint(directory, tensors)
    write_tiny_tokenizer(directory)  # its tokenizer, chat template and audio preprocessor
    return tensors
