"""Random-weight Qwen2-style decoders in the Hugging Face layout, as vLLM loads real ones.

Both tiny LLMs (the Thinker over text, the Talker over speech codes) are `Qwen2ForCausalLM`
checkpoints: config.json plus model.safetensors with the tensor names of the real architecture.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

INIT_STD = 0.02  # the Qwen2 initializer range


@dataclass(frozen=True)
class Qwen2Shape:
    """The sizes of one tiny Qwen2 decoder (head_dim = hidden / heads must suit CPU attention)."""

    vocab_size: int
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 2
    max_positions: int = 2048


def qwen2_config(shape: Qwen2Shape, bos_id: int | None, eos_id: int | None) -> dict:
    """config.json of a tied-embedding Qwen2ForCausalLM of this shape."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_positions,
        "initializer_range": INIT_STD,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "dtype": "float32",
    }


def qwen2_weights(shape: Qwen2Shape, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random weights under Qwen2's tensor names (normal init, unit norms, zero biases)."""
    h, inter = shape.hidden_size, shape.intermediate_size
    head_dim = h // shape.num_heads
    kv = shape.num_kv_heads * head_dim

    def normal(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator) * INIT_STD

    weights = {"model.embed_tokens.weight": normal(shape.vocab_size, h)}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        weights |= {
            p + "self_attn.q_proj.weight": normal(h, h),
            p + "self_attn.q_proj.bias": torch.zeros(h),
            p + "self_attn.k_proj.weight": normal(kv, h),
            p + "self_attn.k_proj.bias": torch.zeros(kv),
            p + "self_attn.v_proj.weight": normal(kv, h),
            p + "self_attn.v_proj.bias": torch.zeros(kv),
            p + "self_attn.o_proj.weight": normal(h, h),
            p + "mlp.gate_proj.weight": normal(inter, h),
            p + "mlp.up_proj.weight": normal(inter, h),
            p + "mlp.down_proj.weight": normal(h, inter),
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
        }
    weights["model.norm.weight"] = torch.ones(h)
    return weights


def write_qwen2(
    directory: Path,
    shape: Qwen2Shape,
    seed: int,
    *,
    bos_id: int | None,
    eos_id: int | None,
) -> None:
    """Write config.json and model.safetensors of a random Qwen2 decoder into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    config = qwen2_config(shape, bos_id, eos_id)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = qwen2_weights(shape, torch.Generator().manual_seed(seed))
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})


def load_embedding_table(directory: Path) -> torch.Tensor:
    """The decoder's input embedding table (vocab, hidden), read from its safetensors."""
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        table: torch.Tensor = f.get_tensor("model.embed_tokens.weight")
        return table
