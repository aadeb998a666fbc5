"""A tiny Qwen3-Omni configuration: the real release's architecture at test size.

Every part Qwen3-Omni-30B-A3B has is here: the thinker (audio encoder, vision encoder with its
deepstack mergers, a mixture-of-experts text model with q/k norms and interleaved M-RoPE), the
talker (a mixture-of-experts text model with a gated shared expert, fed from a middle thinker
layer, and its multi-token code predictor) and code2wav (a sliding-window transformer, then
causal transposed and plain convolutions). It is written with the field names and nesting of
the published config.json (`rope_theta` and `rope_scaling` beside each text model, the talker's
`shared_expert_intermediate_size`, code2wav's quantizer fields), so the configuration class is
shown to accept a published configuration as it is; only the sizes shrink.

What is kept as published: 16 codebooks a frame (the code predictor's `num_code_groups`,
code2wav's `num_quantizers`), code2wav's upsampling (8, 5, 4, 3 then 2, 2: 1920 samples a frame,
12.5 frames a second at 24 kHz), the mixture-of-experts layouts (the thinker without a shared
expert, the talker with one, top-k over several experts) and the layout of the special ids.
What shrinks: widths, layers, experts (4, two a token), vocabularies, and code2wav's sliding
window (`CODE2WAV_WINDOW` frames instead of 72, so that a test of a few dozen frames crosses it).
The layers vLLM will serve (the thinker's and the talker's text models, the code predictor) use
head_dim 64, a size CPU attention accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import Qwen3OmniMoeConfig

ARCHITECTURE = "Qwen3OmniMoeForConditionalGeneration"  # the published config.json's
THINKER_HIDDEN = 128
TALKER_HIDDEN = 128
HEAD_DIM = 64
MROPE_SECTION = [12, 10, 10]  # sums to HEAD_DIM / 2, as the published [24, 20, 20] to 64
NUM_CODE_GROUPS = 16  # codebooks a frame, as published
CODEBOOK_SIZE = 128  # codes of each codebook (the release: 2048)
CODE2WAV_WINDOW = 12  # code2wav's sliding attention window in frames (the release: 72)
# The published layout of ids, shifted: the thinker's specials start at 151643 in a vocabulary of
# 152064, the codec's specials at 2048 + 100 in the talker's 3072 rows.
PUBLISHED_SPECIALS = 151643
SPECIALS_AT = 448  # where the tiny vocabulary's specials start
THINKER_VOCAB = 512
TALKER_VOCAB = CODEBOOK_SIZE + 256  # codes, then the codec's specials and speakers
PUBLISHED_CODEBOOK = 2048


def _special(published: int) -> int:
    """A special token's tiny id: its published offset from the first special, kept."""
    return SPECIALS_AT + published - PUBLISHED_SPECIALS


def _codec(published: int) -> int:
    """A codec special's tiny id: its published offset after the codes, kept."""
    return CODEBOOK_SIZE + published - PUBLISHED_CODEBOOK


@dataclass(frozen=True)
class TokenIds:
    """The thinker-vocabulary ids the configuration names. `user`, `system` and `assistant`
    are ordinary text tokens in the published tokenizer (872, 8948, 77091), the rest are
    specials laid out as published from `SPECIALS_AT`."""

    vocab_size: int = THINKER_VOCAB
    im_start: int = _special(151644)
    im_end: int = _special(151645)
    vision_start: int = _special(151652)
    vision_end: int = _special(151653)
    image: int = _special(151655)
    video: int = _special(151656)
    audio_start: int = _special(151669)
    audio_end: int = _special(151670)
    tts_pad: int = _special(151671)
    tts_bos: int = _special(151672)
    tts_eos: int = _special(151673)
    audio: int = _special(151675)
    user: int = 300
    system: int = 301
    assistant: int = 302


@dataclass(frozen=True)
class CodecIds:
    """The talker-vocabulary ids of the codec's specials and speakers."""

    pad: int = _codec(2148)
    bos: int = _codec(2149)
    eos: int = _codec(2150)
    nothink: int = _codec(2155)
    think_bos: int = _codec(2156)
    think_eos: int = _codec(2157)
    speakers: dict[str, int] = field(default_factory=lambda: {
        "chelsie": _codec(2301), "ethan": _codec(2302), "aiden": _codec(2303)})


def tiny_config(ids: TokenIds | None = None, codec: CodecIds | None = None
                ) -> Qwen3OmniMoeConfig:
    """The tiny Qwen3-Omni configuration, built from a published-style dictionary."""
    return Qwen3OmniMoeConfig(**tiny_config_dict(ids or TokenIds(), codec or CodecIds()))


def tiny_config_dict(ids: TokenIds, codec: CodecIds) -> dict[str, Any]:
    """The tiny configuration as the published config.json lays it out (its names)."""
    return omni_config_dict(ids, _thinker(ids), _talker(ids, codec), _code2wav())


def omni_config_dict(ids: TokenIds, thinker: dict[str, Any], talker: dict[str, Any],
                     code2wav: dict[str, Any]) -> dict[str, Any]:
    """A Qwen3-Omni configuration as the published config.json lays it out: the top level's
    architecture and ids around the three parts' configurations (this module's at test size,
    `real_size.py`'s as published)."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3_omni_moe",
        "enable_audio_output": True,
        "im_start_token_id": ids.im_start, "im_end_token_id": ids.im_end,
        "tts_pad_token_id": ids.tts_pad, "tts_bos_token_id": ids.tts_bos,
        "tts_eos_token_id": ids.tts_eos, "system_token_id": ids.system,
        "user_token_id": ids.user, "assistant_token_id": ids.assistant,
        "thinker_config": thinker,
        "talker_config": talker,
        "code2wav_config": code2wav,
    }


def thinker_ids(ids: TokenIds) -> dict[str, Any]:
    """The ids the thinker's configuration names, and its audio positions' timing (13 a
    second, chunks of 2 s), as published."""
    return {
        "audio_start_token_id": ids.audio_start, "audio_end_token_id": ids.audio_end,
        "audio_token_id": ids.audio, "image_token_id": ids.image, "video_token_id": ids.video,
        "vision_start_token_id": ids.vision_start, "vision_end_token_id": ids.vision_end,
        "position_id_per_seconds": 13, "seconds_per_chunk": 2, "user_token_id": ids.user,
    }


def talker_ids(ids: TokenIds, codec: CodecIds) -> dict[str, Any]:
    """The thinker-vocabulary and codec ids the talker's configuration names, and its speakers'
    (the ids of the codec's speaker rows)."""
    return {
        "audio_start_token_id": ids.audio_start, "audio_end_token_id": ids.audio_end,
        "audio_token_id": ids.audio, "image_token_id": ids.image, "video_token_id": ids.video,
        "vision_start_token_id": ids.vision_start,
        "codec_bos_id": codec.bos, "codec_eos_token_id": codec.eos, "codec_pad_id": codec.pad,
        "codec_nothink_id": codec.nothink, "codec_think_bos_id": codec.think_bos,
        "codec_think_eos_id": codec.think_eos,
        "speaker_id": dict(codec.speakers),
    }


def _rope_scaling() -> dict[str, Any]:
    return {"mrope_section": MROPE_SECTION, "interleaved": True, "mrope_interleaved": True,
            "rope_type": "default"}


def _moe_text(hidden: int, vocab: int, shared: int) -> dict[str, Any]:
    """A mixture-of-experts text model: 2 layers, 2 heads of 64 over 1 key/value head, 4
    experts (2 a token), `shared` the gated shared expert's width (0: none, the thinker's)."""
    return {
        "num_hidden_layers": 2, "hidden_size": hidden, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": HEAD_DIM, "intermediate_size": 2 * hidden,
        "moe_intermediate_size": 64, "shared_expert_intermediate_size": shared,
        "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "use_qk_norm": True,
        "vocab_size": vocab, "rope_theta": 1000000, "rope_scaling": _rope_scaling(),
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "attention_bias": False, "sliding_window": None, "use_sliding_window": False,
        "tie_word_embeddings": False,
    }


def _thinker(ids: TokenIds) -> dict[str, Any]:
    return {
        **thinker_ids(ids),
        "audio_config": {
            "num_mel_bins": 128, "d_model": 64, "encoder_attention_heads": 2,
            "encoder_ffn_dim": 128, "encoder_layers": 2, "downsample_hidden_size": 32,
            "output_dim": THINKER_HIDDEN, "n_window": 50, "n_window_infer": 800,
            "conv_chunksize": 500, "max_source_positions": 1500,
        },
        "vision_config": {
            # deepstack: merged features of each listed layer go to the text model's first
            # layers (the release: 3 of 27, into 3 of 48)
            "depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64,
            "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
            "out_hidden_size": THINKER_HIDDEN, "in_channels": 3,
            "deepstack_visual_indexes": [0, 1], "num_position_embeddings": 64,
            "apply_vit_abs_pos_embed": True, "tokens_per_second": 2,
        },
        "text_config": _moe_text(THINKER_HIDDEN, ids.vocab_size, shared=0),
    }


def _talker(ids: TokenIds, codec: CodecIds) -> dict[str, Any]:
    return {
        "accept_hidden_layer": 1,  # the thinker layer whose states feed the talker (24 of 48)
        **talker_ids(ids, codec),
        "num_code_groups": NUM_CODE_GROUPS, "thinker_hidden_size": THINKER_HIDDEN,
        "spatial_merge_size": 2, "position_id_per_seconds": 13, "seconds_per_chunk": 2,
        "text_config": _moe_text(TALKER_HIDDEN, TALKER_VOCAB, shared=2 * TALKER_HIDDEN),
        "code_predictor_config": {
            "num_hidden_layers": 2, "hidden_size": TALKER_HIDDEN, "head_dim": HEAD_DIM,
            "num_attention_heads": 2, "num_key_value_heads": 1,
            "intermediate_size": 2 * TALKER_HIDDEN, "vocab_size": CODEBOOK_SIZE,
            "num_code_groups": NUM_CODE_GROUPS, "rope_theta": 1000000, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 64,
        },
    }


def _code2wav() -> dict[str, Any]:
    return {
        "num_quantizers": NUM_CODE_GROUPS, "num_semantic_quantizers": 1,
        "codebook_size": CODEBOOK_SIZE, "semantic_codebook_size": 2 * CODEBOOK_SIZE,
        "codebook_dim": 32, "vector_quantization_hidden_dimension": 32,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2, "sliding_window": CODE2WAV_WINDOW,
        "rope_theta": 10000, "rms_norm_eps": 1e-5, "layer_scale_initial_scale": 0.01,
        # halved at each of the 4 upsamplings: 4 channels reach the last convolution
        "decoder_dim": 64, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
        "max_position_embeddings": 8000, "hidden_act": "silu", "attention_bias": False,
    }
