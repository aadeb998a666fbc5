"""What the thinker's and the talker's LM directories share: each is one of Qwen3-Omni's text
models written as a plain `Qwen3MoeForCausalLM`, which stock vLLM serves (`thinker_lm.py`,
`talker_lm.py`).

Both text models are Qwen3-MoE decoders under interleaved M-RoPE whose positions are equal in
all three components for audio and text prompts, where M-RoPE is 1-D RoPE at the same theta.
So their config.json carries the same fields from the text config (`lm_config`: sizes, experts,
routing, RoPE theta, head_dim, dtype), each LM adding what differs (its sparse-layer layout,
token ids, tied head, the talker's shared expert), and both refuse the same settings the plain
decoder would compute differently (`check_plain_decoder`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import Qwen3MoeConfig

ARCHITECTURE = "Qwen3MoeForCausalLM"
GENERATION_CONFIG = "generation_config.json"


def lm_config(release: Path, text: Any, **fields: Any) -> Qwen3MoeConfig:
    """The Qwen3-MoE config of the text config `text` from `release`: its sizes, experts and
    routing, 1-D RoPE at its theta, no sliding window (both text models attend to
    everything), its head_dim and dtype (the release's where the text config names none);
    `fields` add the LM's own (sparse layout, token ids, tied head, ...)."""
    shared: dict[str, Any] = dict(
        architectures=[ARCHITECTURE],
        vocab_size=text.vocab_size, hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size, num_hidden_layers=text.num_hidden_layers,
        num_attention_heads=text.num_attention_heads,
        num_key_value_heads=text.num_key_value_heads, hidden_act=text.hidden_act,
        max_position_embeddings=text.max_position_embeddings, rms_norm_eps=text.rms_norm_eps,
        attention_bias=text.attention_bias,
        rope_parameters={"rope_type": "default",
                         "rope_theta": text.rope_parameters["rope_theta"]},
        use_sliding_window=False, sliding_window=None,
        moe_intermediate_size=text.moe_intermediate_size, num_experts=text.num_experts,
        num_experts_per_tok=text.num_experts_per_tok, norm_topk_prob=text.norm_topk_prob,
        dtype=text.dtype or release_dtype(release),
        # Not a declared field of Qwen3MoeConfig, read as getattr(config, "head_dim", hidden /
        # heads) by transformers and vLLM alike: the published thinker's 128 is not 2048 / 32.
        head_dim=text.head_dim,
    )
    return Qwen3MoeConfig(**(shared | fields))


def check_plain_decoder(text: Any, model: str, problems: list[str]) -> None:
    """Refuse, naming every problem, a text model (of `model`: "thinker", "talker") that the
    plain Qwen3-MoE decoder would compute differently: the `problems` its LM found, and
    attention biases (the reference's would bias the output projection too, vLLM's Qwen3-MoE
    biases q, k and v only) or a RoPE scaling other than the default."""
    problems = list(problems)
    if text.attention_bias:
        problems.append("attention_bias is true")
    if text.rope_parameters.get("rope_type", "default") != "default":
        problems.append(f"rope_type is {text.rope_parameters['rope_type']!r}")
    if problems:
        raise ValueError(f"the {model}'s text model is no plain Qwen3-MoE decoder: "
                         + "; ".join(problems))


def release_dtype(release: Path) -> str:
    """The release's dtype as its config.json names it (float32 if it names none)."""
    config = json.loads((Path(release) / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")
