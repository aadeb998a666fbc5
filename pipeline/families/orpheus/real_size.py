"""Orpheus 3B and SNAC 24 kHz at their real sizes with no trained weights, for the GPU check.

The talker is Orpheus's Llama-3.2-3B (canopylabs/orpheus-3b-0.1-ft's config.json: hidden 3072,
28 layers, 24 heads of 128, 8 KV heads, intermediate 8192, tied embeddings, Llama 3's RoPE
scaling) over the family's 156940-id vocabulary, with the tiny build's tokenizer (the real
control ids at their places); its safetensors is sparse (`dummy_weights.py`): vLLM starts it
with `load_format="dummy"`. SNAC is `SNAC_24KHZ`, the released snac_24khz's own constructor
arguments, with the `snac` package's random initialisation (20M parameters: written whole).
The layout is a real checkpoint's: talker/ and snac/ in one directory.

`write_real_width_checkpoint` writes the same widths with the talker cut to a layer or two and
RANDOM weights (bfloat16, a fixed seed), beside a Qwen2.5-Omni thinker/ at its real widths
(`qwen25_omni.real_widths`): a checkpoint that `omnivox serve --profile orpheus --device cpu`
runs on a CPU, to rehearse the real sizes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from snac import SNAC
from transformers import LlamaConfig, LlamaForCausalLM

from pipeline.families import load_family
from pipeline.families.kit.build_support import write_json
from pipeline.families.kit.dummy_weights import (
    meta_tensors,
    parameter_count,
    write_sparse_checkpoint,
)
from pipeline.families.orpheus import prompt
from pipeline.families.orpheus.build import VOCAB_SIZE, _write_tokenizer
from pipeline.families.orpheus.release import OMNI_THINKER, THINKER
from pipeline.families.orpheus.snac_decoder import SNAC_24KHZ, write_snac

TALKER, SNAC_DIR = "talker", "snac"  # a real checkpoint's parts
ORPHEUS_3B: dict[str, Any] = {
    "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
    "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128}
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


def talker_config() -> LlamaConfig:
    """Orpheus 3B's Llama configuration."""
    return LlamaConfig(
        vocab_size=VOCAB_SIZE, **ORPHEUS_3B, max_position_embeddings=131072, rms_norm_eps=1e-5,
        tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE, architectures=["LlamaForCausalLM"],
        bos_token_id=prompt.BEGIN_OF_TEXT, eos_token_id=prompt.END_OF_SPEECH,
        pad_token_id=prompt.END_OF_SPEECH, dtype="bfloat16")


def write_dummy_checkpoint(directory: Path, seed: int = 0) -> None:
    """Write talker/ (weightless) and snac/ (random) into `directory`."""
    directory = Path(directory)
    config = talker_config()
    talker = directory / TALKER
    talker.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(talker)
    tensors = meta_tensors(lambda: LlamaForCausalLM(config))
    tensors.pop("lm_head.weight", None)  # tied: the release stores the embedding once
    write_sparse_checkpoint(talker, tensors)
    write_json(talker / "generation_config.json", {
        "bos_token_id": prompt.BEGIN_OF_TEXT, "eos_token_id": prompt.END_OF_SPEECH,
        "pad_token_id": prompt.END_OF_SPEECH})
    _write_tokenizer(talker)
    write_snac(directory / SNAC_DIR, SNAC_24KHZ, seed)


def write_real_width_checkpoint(directory: Path, layers: int = 1, seed: int = 0,
                                thinker: Path | None = None) -> Path:
    """Write talker/ (Orpheus 3B's widths, `layers` layers, random weights), snac/ (random)
    and thinker/ (a real-width Qwen2.5-Omni release; `thinker`: link that one instead)."""
    directory = Path(directory)
    config = talker_config()
    config.num_hidden_layers = layers
    talker = directory / TALKER
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built as stored: half the RAM
    try:
        LlamaForCausalLM(config).save_pretrained(talker)
    finally:
        torch.set_default_dtype(default)
    write_json(talker / "generation_config.json", {
        "bos_token_id": prompt.BEGIN_OF_TEXT, "eos_token_id": prompt.END_OF_SPEECH,
        "pad_token_id": prompt.END_OF_SPEECH})
    _write_tokenizer(talker)
    write_snac(directory / SNAC_DIR, SNAC_24KHZ, seed)
    if thinker is None:
        # the qwen25_omni family's, by name through the registry: a family imports no other
        load_family(OMNI_THINKER).write_real_widths(directory / THINKER, layers, seed)
    else:
        (directory / THINKER).symlink_to(Path(thinker).resolve())
    return directory


def stage_sizes(checkpoint: Path) -> dict[str, Any]:
    """Per stage and part of a checkpoint (talker/, snac/): parameters and weight memory
    (talker bfloat16, SNAC float32, as the `orpheus` profile places them on a GPU), counted on
    the meta device from the config files."""
    config = LlamaConfig.from_pretrained(Path(checkpoint) / TALKER)
    tensors = meta_tensors(lambda: LlamaForCausalLM(config))
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    snac_config = json.loads((Path(checkpoint) / SNAC_DIR / "config.json").read_text())
    talker = parameter_count(tensors)
    snac = parameter_count(meta_tensors(lambda: SNAC(**snac_config)))
    return {"talker": {"Orpheus talker (vLLM)": {"parameters": talker,
                                                 "weight_bytes": 2 * talker}},
            "voicebox": {"SNAC 24 kHz (torch)": {"parameters": snac,
                                                 "weight_bytes": 4 * snac}}}
