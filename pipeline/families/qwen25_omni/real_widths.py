"""Qwen2.5-Omni-7B at its real widths with its layers cut: a release to rehearse real sizes.

Tiny checkpoints prove code paths, not sizes: a 3584-wide row is 28 times a tiny one, the
talker has 12 heads of 128 in an 896 width, the vocabulary 152064 rows. This release keeps every
width of the published 7B (`real_size.real_config`) and cuts each stack to `layers` layers
(the thinker's LM, its audio and vision towers, the talker); token2wav's DiT keeps two, one
looking back and one ahead, the least its block attention has both kinds of. The weights are
RANDOM (a fixed seed) with random non-zero Linear biases, stored in bfloat16 and sharded as the
release is, under its published names (`Qwen2_5OmniModel`). At one layer a stack it holds 1.95B
parameters (3.9 GB): about a minute to write on one core.

The tokenizer is the tiny one (the real one cannot be downloaded here); its ids lie inside the
real vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

from pipeline.families.qwen25_omni import tiny_tokenizer
from pipeline.families.qwen25_omni.real_size import real_config
from pipeline.families.qwen25_omni.release import (
    BIGVGAN_GAIN,
    generation_config,
    name_architecture,
    random_biases,
    write_release_files,
)

LAYERS = 1  # per stack, by default
DIT_LAYERS = 2  # token2wav's DiT: a look-back layer and a look-ahead one
SHARD = "1GB"  # five shards at one layer a stack, as the published release has


def real_width_config(layers: int = LAYERS) -> Qwen2_5OmniConfig:
    """Qwen2.5-Omni-7B's configuration with each stack cut to `layers` layers."""
    if layers < 1:
        raise ValueError(f"layers: at least 1, got {layers}")
    data: dict[str, Any] = real_config().to_dict()
    thinker = data["thinker_config"]
    _cut_decoder(thinker["text_config"], layers)
    _cut_decoder(data["talker_config"], layers)
    thinker["audio_config"]["encoder_layers"] = layers
    thinker["vision_config"].update(depth=layers, fullatt_block_indexes=[layers - 1])
    data["token2wav_config"]["dit_config"].update(
        num_hidden_layers=DIT_LAYERS, look_backward_layers=[0], look_ahead_layers=[1])
    return Qwen2_5OmniConfig.from_dict(data)


def write_real_width_release(directory: Path, layers: int = LAYERS, seed: int = 0) -> Path:
    """Write the cut release (random weights from `seed`, bfloat16) into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer.train_tokenizer()
    config = real_width_config(layers)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in the dtype it is stored in: half the RAM
    try:
        model = Qwen2_5OmniForConditionalGeneration(config).eval()
    finally:
        torch.set_default_dtype(default)
    random_biases(model, torch.Generator().manual_seed(seed + 2))
    with torch.no_grad():  # as the tiny release: random BigVGAN weights speak near silence
        model.token2wav.code2wav_bigvgan_model.conv_post.weight.mul_(BIGVGAN_GAIN)
    model.generation_config = generation_config(tiny_tokenizer.token_ids(tokenizer))
    model.save_pretrained(directory, max_shard_size=SHARD)
    name_architecture(directory)
    write_release_files(directory, tokenizer, config, seed)
    return directory


def _cut_decoder(config: dict[str, Any], layers: int) -> None:
    """A decoder config cut to `layers` layers (its per-layer list follows the count)."""
    config.update(num_hidden_layers=layers, max_window_layers=layers)
    config.pop("layer_types", None)
