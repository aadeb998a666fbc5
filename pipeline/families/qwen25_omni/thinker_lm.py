"""The thinker's language model as a plain `Qwen2ForCausalLM` directory, for stock vLLM.

Qwen2.5-Omni's thinker over prompt embeddings is a Qwen2 decoder: for audio and text prompts
M-RoPE's three position components are equal, so 1-D RoPE computes the same thing (measured,
PLATFORM.md). This module writes that decoder from a release: a Qwen2 config.json with the
thinker's text sizes, the thinker's `model.*` and `lm_head` tensors renamed (`thinker.` dropped),
one output shard per release shard so a real release is converted a shard at a time, and the
release's tokenizer files. A release whose thinker ties its lm_head to its input embedding
(`tie_word_embeddings`) gives an LM tied the same way. The same code converts tiny and real
releases.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import AutoTokenizer, Qwen2_5OmniConfig, Qwen2Config, Qwen2ForCausalLM

from pipeline.families.kit.build_support import write_json
from pipeline.families.kit.dummy_weights import meta_tensors, write_sparse_checkpoint
from pipeline.families.kit.hf_release import WEIGHTS_INDEX, copy_tokenizer_files
from pipeline.families.kit.release_tensors import write_renamed_shards
from pipeline.families.qwen25_omni.release import thinker_head_tied

PREFIXES = ("thinker.model.", "thinker.lm_head.")
EMBED_TABLE = "model.embed_tokens.weight"


def write_thinker_lm(release: Path, directory: Path, dummy_weights: bool = False) -> None:
    """Write the thinker's LM from the release directory `release` into `directory`.

    `dummy_weights`: the release is weightless (`dummy_weights.py`); so is the LM, written as
    the renaming would (holes stay holes) without reading or writing its data.
    """
    release, directory = Path(release), Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = lm_config(release)
    config.save_pretrained(directory)
    if dummy_weights:
        write_sparse_checkpoint(directory, meta_tensors(lambda: Qwen2ForCausalLM(config)))
    else:
        write_renamed_shards(release, directory, PREFIXES, "thinker.")
    copy_tokenizer_files(release, directory)
    tokenizer = AutoTokenizer.from_pretrained(release)
    stops = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    write_json(directory / "generation_config.json",
               {"eos_token_id": stops, "pad_token_id": stops[1]})


def lm_config(release: Path) -> Qwen2Config:
    """The Qwen2 config of the release's thinker text model (1-D RoPE, same theta)."""
    thinker: Any = Qwen2_5OmniConfig.from_pretrained(release).thinker_config  # a sub-config
    text = thinker.text_config
    rope = text.rope_parameters or {}
    return Qwen2Config(
        architectures=["Qwen2ForCausalLM"],
        vocab_size=text.vocab_size, hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size, num_hidden_layers=text.num_hidden_layers,
        num_attention_heads=text.num_attention_heads,
        num_key_value_heads=text.num_key_value_heads, hidden_act=text.hidden_act,
        max_position_embeddings=text.max_position_embeddings, rms_norm_eps=text.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": rope.get("rope_theta", 1e6)},
        use_sliding_window=text.use_sliding_window, sliding_window=text.sliding_window,
        max_window_layers=text.max_window_layers,
        tie_word_embeddings=thinker_head_tied(release),
        bos_token_id=text.bos_token_id, eos_token_id=text.eos_token_id,
        pad_token_id=text.pad_token_id, dtype=text.dtype or "float32",
    )


def read_embed_table(directory: Path, dtype: torch.dtype) -> torch.Tensor:
    """The LM's (vocab, hidden) input embedding alone, read from its shard (a Thinker whose
    Talker reads no hidden states embeds its prompts with it and needs nothing else)."""
    index = Path(directory) / WEIGHTS_INDEX
    shard = (json.loads(index.read_text())["weight_map"][EMBED_TABLE] if index.is_file()
             else "model.safetensors")
    with safe_open(Path(directory) / shard, "pt") as weights:
        table: torch.Tensor = weights.get_tensor(EMBED_TABLE)
    return table.to(dtype)
