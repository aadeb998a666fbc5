"""A GGUF file of a Llama-architecture model, converted to a Hugging Face model directory.

vLLM on CPU serves safetensors, not GGUF: every tensor is dequantized to float32 with the
`gguf` package, renamed from llama.cpp's names to the Hugging Face Llama names, and the query
and key projections are put back in Hugging Face's rotary layout (llama.cpp's converter
interleaves the two halves of each head). The tokenizer and chat template come from the GGUF
metadata through transformers. The result loads in vLLM as `LlamaForCausalLM`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
# llama.cpp tensor name (per block: "blk.N." + key) -> Hugging Face Llama name.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


class GgufConversionError(ValueError):
    """A GGUF file this converter cannot turn into a Llama model directory."""


@dataclass(frozen=True)
class LlamaShape:
    """The hyper-parameters of a Llama model, as the GGUF metadata records them."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    bos_token_id: int
    eos_token_id: int
    tie_word_embeddings: bool

    def config(self) -> dict[str, Any]:
        """The Hugging Face `config.json` of this model (float32 weights)."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.hidden_size // self.num_heads,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "torch_dtype": "float32",
        }


def read_shape(reader: Any) -> LlamaShape:
    """The model's shape from a `gguf.GGUFReader`; a clear error for other architectures."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise GgufConversionError(f"GGUF architecture {arch!r}: only 'llama' is supported")
    names = {tensor.name for tensor in reader.tensors}
    embed = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return LlamaShape(
        vocab_size=int(embed.shape[1]),  # GGUF lists dimensions innermost first
        hidden_size=int(_field(reader, "llama.embedding_length")),
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_layers=int(_field(reader, "llama.block_count")),
        num_heads=int(_field(reader, "llama.attention.head_count")),
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(_field(reader, "llama.context_length")),
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
        tie_word_embeddings="output.weight" not in names,
    )


def convert_gguf_llama(gguf_path: Path, out_dir: Path, progress: bool = True) -> LlamaShape:
    """Write `out_dir` (config, float32 safetensors, tokenizer, generation config)."""
    import gguf
    from safetensors.numpy import save_file

    reader = gguf.GGUFReader(str(gguf_path))
    shape = read_shape(reader)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = dict(_hf_tensors(reader, shape, progress))
    expected = 2 + len(_BLOCK_NAMES) * shape.num_layers + (not shape.tie_word_embeddings)
    if len(tensors) != expected:
        raise GgufConversionError(f"{gguf_path.name}: {len(tensors)} tensors, "
                                  f"expected {expected} for {shape.num_layers} Llama layers")
    save_file(tensors, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    (out_dir / WEIGHTS_FILE).chmod(0o644)  # written 0600; the serving user may differ
    _write_json(out_dir / "config.json", shape.config())
    _write_json(out_dir / "generation_config.json", {
        "bos_token_id": shape.bos_token_id,
        "eos_token_id": shape.eos_token_id,
        "pad_token_id": shape.eos_token_id,
    })
    _save_tokenizer(gguf_path, out_dir)
    return shape


def unpermute_rotary(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head interleaving of a q/k projection (rows = heads x head_dim).

    llama.cpp stores each head's rows as pairs (x0, x_half, x1, x_half+1, ...); Hugging Face
    keeps the first half of the head's rows, then the second half.
    """
    rows, cols = weight.shape
    half = rows // n_heads // 2
    return weight.reshape(n_heads, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _hf_tensors(reader: Any, shape: LlamaShape,
                progress: bool) -> Iterator[tuple[str, np.ndarray]]:
    from gguf import dequantize

    for tensor in tqdm(reader.tensors, desc="converting SmolLM2 GGUF", unit="tensor",
                       disable=not progress):
        name = _hf_name(tensor.name)
        values = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        values = values.reshape([int(d) for d in reversed(tensor.shape)])
        if name.endswith("q_proj.weight"):
            values = unpermute_rotary(values, shape.num_heads)
        elif name.endswith("k_proj.weight"):
            values = unpermute_rotary(values, shape.num_kv_heads)
        yield name, np.ascontiguousarray(values)


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    prefix, _, key = gguf_name.partition(".")
    layer, _, key = key.partition(".")
    if prefix != "blk" or not layer.isdigit() or key not in _BLOCK_NAMES:
        raise GgufConversionError(f"unexpected GGUF tensor {gguf_name!r} for a Llama model")
    return f"model.layers.{layer}.{_BLOCK_NAMES[key]}"


def _save_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    """The GGUF's tokenizer and chat template, as a Hugging Face fast tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if not tokenizer.chat_template:
        raise GgufConversionError(f"{gguf_path.name} carries no chat template")
    tokenizer.save_pretrained(str(out_dir))


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        raise GgufConversionError(f"GGUF metadata has no {key!r}")
    return field.contents()


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")
