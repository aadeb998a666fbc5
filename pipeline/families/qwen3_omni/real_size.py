"""Qwen3-Omni-30B-A3B-Instruct's published configuration, and its size.

`real_config()` is the published config.json of Qwen/Qwen3-Omni-30B-A3B-Instruct as a
`Qwen3OmniMoeConfig`, with its field names and nesting (`rope_theta` and `rope_scaling` beside
each text model, as `tiny_config.py` writes them). transformers' own defaults are NOT that
release: its `Qwen3OmniMoeTextConfig()` has 28 layers of 28 heads and 3584 rows, its talker 32
code groups and codec ids near 4200, its towers an output width of 3584. Where the values come
from:

- Widths, layers, heads, experts, vocabularies, rope and window settings of every part, and
  every id: two copies of the published config.json found with the `search` tool (a report that
  printed the checkpoint's `Qwen3OmniMoeConfig` as loaded from a download of the Instruct
  release, and a parser's test that inlines a trimmed copy of it); they agree on every value
  both hold, and so do the config.json files of fine-tunes on the Hub that keep the
  architecture (code2wav's and the talker's fields, as far as the excerpts show). Where a
  value is one the configuration class also defaults to (the audio encoder's 32 layers of
  1280, the vision encoder's 27 blocks of 1152 with deepstack at 8, 16, 24, code2wav's 8
  layers, 72-frame window and 1536-wide decoder, the code predictor's 5 layers),
  transformers 5.19's configuration_qwen3_omni_moe.py agrees too.
- The id layout (thinker specials from 151643 in 152064 rows; the codec's specials from 2048 + 100
  in the talker's 3072 rows; speakers chelsie, ethan, aiden at 2301 to 2303; user, system and
  assistant as ordinary text tokens 872, 8948, 77091): `tiny_config.py`, which keeps it.
- Sizes: the same report counted 35,259,818,545 parameters in the release's 15 safetensors
  shards (65.68 GB in bfloat16); `release_tensors(real_config())` counts the same on the meta
  device: the thinker 31.7B of it (its text model and head 30.5B, the size of Qwen3-30B-A3B,
  whose shape it has), the talker 3.3B, code2wav 0.2B.

Not confirmed: some values come from the loaded report alone, and a loaded config also shows
fields the class adds: the thinker text model's `intermediate_size` 768 (unused: every layer is
sparse), the vision encoder's `image_size`, `in_chans` and `spatial_patch_size` (unread by the
class), `"type": "default"` beside `rope_type` in both rope dictionaries and the thinker's
`mrope_interleaved` (the class reads `rope_type`; both say `interleaved`). Fields neither copy
shows are left at the class's defaults (the towers' `initializer_range`, the audio encoder's
dropouts); they change no size.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

from pipeline.families.kit.dummy_weights import meta_tensors, parameter_count
from pipeline.families.qwen3_omni.tiny_config import (
    CodecIds,
    TokenIds,
    omni_config_dict,
    talker_ids,
    thinker_ids,
)

THINKER_HIDDEN = 2048
TALKER_HIDDEN = 1024
HEAD_DIM = 128
MROPE_SECTION = [24, 20, 20]  # sums to HEAD_DIM / 2
NUM_CODE_GROUPS = 16
CODEBOOK_SIZE = 2048
THINKER_VOCAB = 152064
ACCEPT_HIDDEN_LAYER = 24  # the thinker layer whose states feed the talker, of 48
DEEPSTACK_INDEXES = [8, 16, 24]  # vision blocks whose merged features join the text model
VISION_DEPTH = 27
# The published ids (tiny_config.py keeps their layout in a small vocabulary).
PUBLISHED_IDS = TokenIds(
    vocab_size=THINKER_VOCAB, im_start=151644, im_end=151645, vision_start=151652,
    vision_end=151653, image=151655, video=151656, audio_start=151669, audio_end=151670,
    tts_pad=151671, tts_bos=151672, tts_eos=151673, audio=151675, user=872, system=8948,
    assistant=77091)
PUBLISHED_CODEC = CodecIds(pad=2148, bos=2149, eos=2150, nothink=2155, think_bos=2156,
                           think_eos=2157,
                           speakers={"chelsie": 2301, "ethan": 2302, "aiden": 2303})
# What each part holds, by release prefix: (parameters counted under it).
PARTS = {"thinker LM": ("thinker.model.", "thinker.lm_head."),
         "audio encoder": ("thinker.audio_tower.",), "vision encoder": ("thinker.visual.",),
         "talker": ("talker.",), "code2wav": ("code2wav.",)}


def real_config(ids: TokenIds = PUBLISHED_IDS, codec: CodecIds = PUBLISHED_CODEC
                ) -> Qwen3OmniMoeConfig:
    """Qwen3-Omni-30B-A3B-Instruct's configuration (`ids`, `codec`: its special ids, the
    published ones unless a release's tokenizer places them elsewhere)."""
    return Qwen3OmniMoeConfig(**real_config_dict(ids, codec))


def real_config_dict(ids: TokenIds, codec: CodecIds) -> dict[str, Any]:
    """The configuration as the published config.json lays it out (its names)."""
    return omni_config_dict(ids, _thinker(ids), _talker(ids, codec), _code2wav())


def release_tensors(config: Qwen3OmniMoeConfig) -> dict[str, torch.Tensor]:
    """The release model's state dict on the meta device (no memory)."""
    return meta_tensors(lambda: Qwen3OmniMoeForConditionalGeneration(config))


def part_sizes(tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    """Parameters of each part (`PARTS`) and in all ("total")."""
    sizes = {part: sum(parameter_count(tensors, prefix) for prefix in prefixes)
             for part, prefixes in PARTS.items()}
    return sizes | {"total": parameter_count(tensors)}


def _moe_text(layers: int, hidden: int, heads: int, kv_heads: int, experts_per_token: int,
              moe_width: int) -> dict[str, Any]:
    """What the thinker's and the talker's mixture-of-experts text models share: 128 experts
    (`experts_per_token` routed, renormalised) of `moe_width`, q/k norms, heads of 128."""
    return {
        "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": HEAD_DIM,
        "moe_intermediate_size": moe_width, "num_experts": 128,
        "num_experts_per_tok": experts_per_token, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "rope_theta": 1000000,
        "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "attention_bias": False, "sliding_window": None, "use_sliding_window": False,
        "tie_word_embeddings": False, "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
    }


def _thinker(ids: TokenIds) -> dict[str, Any]:
    text = _moe_text(48, THINKER_HIDDEN, heads=32, kv_heads=4, experts_per_token=8,
                     moe_width=768) | {
        "intermediate_size": 768, "shared_expert_intermediate_size": 0, "use_qk_norm": True,
        "vocab_size": ids.vocab_size,
        "rope_scaling": {"interleaved": True, "mrope_interleaved": True,
                         "mrope_section": MROPE_SECTION, "rope_type": "default",
                         "type": "default"},
    }
    return {
        **thinker_ids(ids),
        "tie_word_embeddings": False,
        "audio_config": {
            "num_mel_bins": 128, "d_model": 1280, "encoder_attention_heads": 20,
            "encoder_ffn_dim": 5120, "encoder_layers": 32, "downsample_hidden_size": 480,
            "output_dim": THINKER_HIDDEN, "n_window": 50, "n_window_infer": 800,
            "conv_chunksize": 500, "max_source_positions": 1500, "scale_embedding": False,
            "activation_function": "gelu",
        },
        "vision_config": {
            "depth": VISION_DEPTH, "hidden_size": 1152, "num_heads": 16,
            "intermediate_size": 4304, "hidden_act": "gelu_pytorch_tanh", "patch_size": 16,
            "spatial_patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
            "out_hidden_size": THINKER_HIDDEN, "in_channels": 3, "in_chans": 3,
            "image_size": 768, "deepstack_visual_indexes": DEEPSTACK_INDEXES,
            "num_position_embeddings": 2304, "apply_vit_abs_pos_embed": True,
            "tokens_per_second": 2,
        },
        "text_config": text,
    }


def _talker(ids: TokenIds, codec: CodecIds) -> dict[str, Any]:
    text = _moe_text(20, TALKER_HIDDEN, heads=16, kv_heads=2, experts_per_token=6,
                     moe_width=384) | {
        "intermediate_size": 2048, "shared_expert_intermediate_size": 768, "vocab_size": 3072,
        "rope_scaling": {"interleaved": True, "mrope_section": MROPE_SECTION,
                         "rope_type": "default", "type": "default"},
    }
    return {
        "accept_hidden_layer": ACCEPT_HIDDEN_LAYER,
        **talker_ids(ids, codec),
        "num_code_groups": NUM_CODE_GROUPS, "thinker_hidden_size": THINKER_HIDDEN,
        "spatial_merge_size": 2, "position_id_per_seconds": 13, "seconds_per_chunk": 2,
        "output_router_logits": False, "tie_word_embeddings": False,
        "text_config": text,
        "code_predictor_config": {
            "num_hidden_layers": 5, "hidden_size": TALKER_HIDDEN, "head_dim": HEAD_DIM,
            "num_attention_heads": 16, "num_key_value_heads": 8, "intermediate_size": 3072,
            "vocab_size": CODEBOOK_SIZE, "num_code_groups": NUM_CODE_GROUPS,
            "rope_theta": 1000000, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
            "hidden_act": "silu", "attention_bias": False, "sliding_window": None,
            "use_sliding_window": False, "max_window_layers": 28, "tie_word_embeddings": False,
        },
    }


def _code2wav() -> dict[str, Any]:
    return {
        "num_quantizers": NUM_CODE_GROUPS, "num_semantic_quantizers": 1,
        "codebook_size": CODEBOOK_SIZE, "semantic_codebook_size": 4096, "codebook_dim": 512,
        "vector_quantization_hidden_dimension": 512,
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 8,
        "num_attention_heads": 16, "num_key_value_heads": 16, "sliding_window": 72,
        "rope_theta": 10000, "rms_norm_eps": 1e-5, "layer_scale_initial_scale": 0.01,
        "decoder_dim": 1536, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
        "max_position_embeddings": 8000, "hidden_act": "silu", "attention_bias": False,
    }
