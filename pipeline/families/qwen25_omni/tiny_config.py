"""A tiny Qwen2.5-Omni configuration: the real release's architecture at test size.

Every part the real release has is here (thinker with audio and vision encoders, talker,
token2wav's DiT and BigVGAN), shrunk so a random-weight build takes about a second and each
stage runs on a CPU in milliseconds. Attention layers served by vLLM (the thinker's and the
talker's language models) use head_dim 64, a size CPU attention accepts. The talker keeps the
real one's head layout: more heads than its width holds (3 of 64 in 128, as 12 of 128 in 896)
and three query heads a key/value head. Special token ids
follow the tiny tokenizer (`tiny_tokenizer.TinyTokens`), laid out after the BPE vocabulary as
the real tokenizer's are after its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import Qwen2_5OmniConfig

THINKER_HIDDEN = 128
TALKER_HIDDEN = 128
HEAD_DIM = 64  # both LMs: the thinker's 2 heads of 64, the talker's 3
TALKER_HEADS = 3  # heads x head_dim = 192, not the width: the real talker's 12 x 128 in 896
MROPE_SECTION = [8, 12, 12]  # sums to HEAD_DIM / 2, as the real [16, 24, 24] does to 64
CODEC_CODES = 256  # speech codes 0..255 (the real release has 8192)
CODEC_VOCAB = 320  # codes, then the codec's specials (the real release: 8448)
CODEC_PAD, CODEC_BOS, CODEC_EOS, CODEC_MASK = 300, 301, 302, 304


@dataclass(frozen=True)
class TokenIds:
    """The thinker-vocabulary ids the configuration names (from the tokenizer)."""

    vocab_size: int  # the LM's embedding rows (>= the tokenizer's length)
    pad: int
    im_end: int
    audio: int
    audio_bos: int
    audio_eos: int
    image: int
    video: int
    vision_bos: int
    vision_eos: int
    vision_pad: int
    tts_pad: int
    tts_bos: int
    tts_eos: int
    user: int


def tiny_config(ids: TokenIds) -> Qwen2_5OmniConfig:
    """The tiny Qwen2.5-Omni configuration for a tokenizer with these ids."""
    return Qwen2_5OmniConfig(
        thinker_config=_thinker(ids),
        talker_config=_talker(ids),
        token2wav_config=_token2wav(),
        enable_audio_output=True,
    )


def _rope() -> dict:
    return {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": MROPE_SECTION}


def _thinker(ids: TokenIds) -> dict:
    return {
        "text_config": {
            "vocab_size": ids.vocab_size, "hidden_size": THINKER_HIDDEN,
            "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 4096,
            "rope_parameters": _rope(), "tie_word_embeddings": False,
            "pad_token_id": ids.pad, "eos_token_id": ids.im_end,
        },
        "audio_config": {
            "num_mel_bins": 128, "encoder_layers": 2, "encoder_attention_heads": 2,
            "encoder_ffn_dim": 128, "d_model": 64, "output_dim": THINKER_HIDDEN,
            "max_source_positions": 1500, "n_window": 100,
        },
        "vision_config": {
            "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "out_hidden_size": THINKER_HIDDEN, "fullatt_block_indexes": [0],
        },
        "audio_token_index": ids.audio, "image_token_index": ids.image,
        "video_token_index": ids.video, "audio_start_token_id": ids.audio_bos,
        "audio_end_token_id": ids.audio_eos, "user_token_id": ids.user,
        "vision_start_token_id": ids.vision_bos, "vision_end_token_id": ids.vision_eos,
        "vision_token_id": ids.vision_pad, "pad_token_id": ids.pad,
    }


def _talker(ids: TokenIds) -> dict:
    return {
        "vocab_size": CODEC_VOCAB, "embedding_size": THINKER_HIDDEN, "hidden_size": TALKER_HIDDEN,
        "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": TALKER_HEADS,
        "num_key_value_heads": 1, "head_dim": HEAD_DIM, "max_position_embeddings": 4096,
        "rope_parameters": _rope(),
        "audio_token_index": ids.audio, "image_token_index": ids.image,
        "video_token_index": ids.video, "vision_start_token_id": ids.vision_bos,
        "vision_end_token_id": ids.vision_eos, "audio_start_token_id": ids.audio_bos,
        "audio_end_token_id": ids.audio_eos,
        "tts_text_start_token_id": ids.tts_bos, "tts_text_end_token_id": ids.tts_eos,
        "tts_text_pad_token_id": ids.tts_pad,
        "tts_codec_start_token_id": CODEC_BOS, "tts_codec_end_token_id": CODEC_EOS,
        "tts_codec_pad_token_id": CODEC_PAD, "tts_codec_mask_token_id": CODEC_MASK,
    }


def _token2wav() -> dict:
    return {
        "dit_config": {
            "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 32,
            "ff_mult": 2, "emb_dim": 32, "num_embeds": CODEC_CODES + 1, "mel_dim": 80,
            "block_size": 24, "look_ahead_layers": [1], "look_backward_layers": [0],
            "repeats": 2, "enc_emb_dim": 32, "enc_dim": 16,
            "enc_channels": [32, 32, 32, 32, 96], "enc_attention_channels": 16,
            "enc_se_channels": 16,
        },
        "bigvgan_config": {
            # halved at each of the 6 upsamplings: 64 is the least that keeps a channel
            "mel_dim": 80, "upsample_initial_channel": 64,
        },
    }
