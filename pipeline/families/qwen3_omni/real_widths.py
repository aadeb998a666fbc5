"""Qwen3-Omni-30B-A3B at its real widths with its layers cut: a release to rehearse real sizes.

Tiny checkpoints prove code paths, not sizes: one layer of the thinker's 128 experts of 768 over
2048 is 604M parameters, its vocabulary 152064 rows, the talker's experts 151M a layer. This
release keeps every width of the published model (`real_size.real_config`) and cuts each stack
to `layers` layers: the thinker's text model, its audio encoder and vision encoder, the
talker's text model, its code predictor and code2wav's transformer (`real_width_config`).
Two fields name layers and are cut with them:

- the vision encoder's `deepstack_visual_indexes` (8, 16, 24 of 27 blocks) are scaled to the
  cut depth, duplicates dropped: [0] at one layer, [0, 1] at two, [0, 1, 2] at three; each
  index has a merger, so below three layers there are fewer mergers (each of the published
  width);
- the talker's `accept_hidden_layer` (24 of the thinker's 48: an index into the thinker's
  hidden states, 0 its embeddings) is clamped to the cut thinker's layers: at one layer the
  talker reads hidden_states[1], what the thinker's only layer gives.

The weights are RANDOM from `seed`, made as the tiny release's are (release.py): the talker's
routed experts drawn (transformers leaves them uninitialised), every parameter initialised to a
constant perturbed (biases, norms, layer scales, routers: none zero or one), code2wav's
convolutions at working gain. The model is built with bfloat16 as torch's default dtype, the
dtype it is stored in (half the RAM of float32), and saved sharded under the published names
(experts one by one, `thinker.model.layers.0.mlp.experts.0.gate_proj.weight`).

At one layer a stack it holds 1,741,237,009 parameters, 3.48 GB in bfloat16 (the thinker's LM
1.25B, of which 0.62B its embedding and head; the talker 0.26B; code2wav 0.12B; the vision
encoder 0.08B, the audio encoder 0.04B), in 15 shards of `SHARD`: measured on a 2-core machine,
30 s to write (45 s through `omnivox models build`, the machine shared) at 4.9 GB of peak RSS.
Each further layer adds about 0.88B (the thinker's experts 0.60B, the talker's 0.15B).

The tokenizer, chat template and audio preprocessor are the tiny release's (`tiny_tokenizer`;
the real tokenizer cannot be downloaded here): the configuration's special ids are the tiny
tokenizer's (`tiny_config.TokenIds`), which lie inside the real vocabulary of 152064 rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

from pipeline.families.qwen3_omni.real_size import (
    ACCEPT_HIDDEN_LAYER,
    DEEPSTACK_INDEXES,
    THINKER_VOCAB,
    VISION_DEPTH,
    real_config,
)
from pipeline.families.qwen3_omni.release import (
    code2wav_at_working_gain,
    perturb_constants,
    redraw_talker_experts,
)
from pipeline.families.qwen3_omni.tiny_config import TokenIds
from pipeline.families.qwen3_omni.tiny_tokenizer import write_tiny_tokenizer

LAYERS = 1  # per stack, by default
SHARD = "120MB"  # 15 shards at one layer a stack, as the published release has


def real_width_config(layers: int = LAYERS) -> Qwen3OmniMoeConfig:
    """Qwen3-Omni-30B-A3B's configuration with each stack cut to `layers` layers, its special
    ids the tiny tokenizer's (inside the real vocabulary)."""
    if layers < 1:
        raise ValueError(f"layers: at least 1, got {layers}")
    data: dict[str, Any] = real_config(TokenIds(vocab_size=THINKER_VOCAB)).to_dict()
    thinker, talker = data["thinker_config"], data["talker_config"]
    thinker["text_config"]["num_hidden_layers"] = layers
    thinker["audio_config"]["encoder_layers"] = layers
    thinker["vision_config"].update(depth=layers,
                                    deepstack_visual_indexes=deepstack_indexes(layers))
    talker["text_config"]["num_hidden_layers"] = layers
    talker["accept_hidden_layer"] = min(ACCEPT_HIDDEN_LAYER, layers)
    _cut_decoder(talker["code_predictor_config"], layers)
    data["code2wav_config"]["num_hidden_layers"] = layers
    return Qwen3OmniMoeConfig.from_dict(data)


def deepstack_indexes(depth: int) -> list[int]:
    """The published deepstack blocks (8, 16, 24 of 27) scaled to a vision encoder of `depth`
    blocks, duplicates dropped."""
    return sorted({index * depth // VISION_DEPTH for index in DEEPSTACK_INDEXES})


def write_real_width_release(directory: Path, layers: int = LAYERS, seed: int = 0) -> Path:
    """Write the cut release (random weights from `seed`, bfloat16) into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = real_width_model(real_width_config(layers), seed)
    model.save_pretrained(directory, max_shard_size=SHARD)
    write_tiny_tokenizer(directory)  # its tokenizer, chat template and audio preprocessor
    return directory


def real_width_model(config: Qwen3OmniMoeConfig, seed: int
                     ) -> Qwen3OmniMoeForConditionalGeneration:
    """The model of `config` in bfloat16, its weights drawn from `seed` as the tiny release's."""
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in the dtype it is stored in: half the RAM
    try:
        model = Qwen3OmniMoeForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(default)
    model.eval()
    generator = torch.Generator().manual_seed(seed + 1)
    redraw_talker_experts(model, generator)  # first: left uninitialised, they may be constant
    perturb_constants(model, generator)
    code2wav_at_working_gain(model.code2wav, generator)
    return model


def _cut_decoder(config: dict[str, Any], layers: int) -> None:
    """A dense decoder config cut to `layers` layers (its per-layer list follows the count)."""
    config.update(num_hidden_layers=layers, max_window_layers=layers)
    config.pop("layer_types", None)
