"""The tiny Qwen3-Omni release's tokenizer and audio preprocessor, written into the release.

The tokenizer is a byte-level BPE trained locally on the kit's built-in corpus (`kit/bpe.py`;
deterministic: same corpus, same merges) whose ids agree with `tiny_config.TokenIds`, what the
tiny configuration names:

- Qwen3-Omni's added tokens in the published order from `SPECIALS_AT` (<|endoftext|> at the
  published 151643's place, <|audio_pad|> at 151675's), so every special id the configuration
  names is the token's own;
- "user", "system" and "assistant", ordinary text tokens in the published tokenizer (872, 8948,
  77091), are one token each here too, at the ids TokenIds gives them (the talker's input
  finds the user turns and the assistant's header by these ids after <|im_start|>).

The chat template is the kit's ChatML (`kit/chatml_tokenizer.py`: each message
`<|im_start|>role\\n` content `<|im_end|>\\n`, the assistant's header to prompt a reply) with an
audio part as `<|audio_start|><|audio_pad|><|audio_end|>` (the prompt builder widens the one
<|audio_pad|> to one row per audio-encoder row, as the processor does).

The audio preprocessor is the processor's: Whisper log-mel features at the audio encoder's mel
bins (128, as published), 16 kHz, hop 160, written as preprocessor_config.json.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer
from transformers import WhisperFeatureExtractor

from pipeline.families.kit.bpe import train_bpe, with_tokens_at
from pipeline.families.kit.chatml_tokenizer import (
    IM_END,
    IM_START,
    PAD,
    chatml_template,
    save_chatml_tokenizer,
)
from pipeline.families.qwen3_omni.tiny_config import SPECIALS_AT, TokenIds

AUDIO, AUDIO_START, AUDIO_END = "<|audio_pad|>", "<|audio_start|>", "<|audio_end|>"
IMAGE, VIDEO = "<|image_pad|>", "<|video_pad|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
# Qwen3-Omni's added tokens in the published order (151643 to 151675)
SPECIAL_TOKENS = [
    PAD, IM_START, IM_END, "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", VISION_START, VISION_END,
    "<|vision_pad|>", IMAGE, VIDEO, "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>", AUDIO_START, AUDIO_END,
    "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", AUDIO,
]
ROLES = ("user", "system", "assistant")
MEL_BINS = 128  # the audio encoder's num_mel_bins, as published

CHAT_TEMPLATE = chatml_template(AUDIO_START + AUDIO + AUDIO_END)
MAX_LENGTH = 32768  # tokenizer_config.json's model_max_length


def train_tokenizer(ids: TokenIds | None = None) -> Tokenizer:
    """The kit's BPE with the role names whole at `ids`' ids, then the special tokens after it
    from SPECIALS_AT; a clear error if any id differs from what `ids` names."""
    ids = ids or TokenIds()
    bpe = train_bpe(SPECIALS_AT, words=ROLES)
    tokenizer = with_tokens_at(bpe, {"user": ids.user, "system": ids.system,
                                     "assistant": ids.assistant})
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    check_ids(tokenizer, ids)
    return tokenizer


def check_ids(tokenizer: Tokenizer, ids: TokenIds) -> None:
    """Raise unless the tokenizer's ids are those `ids` names (and fit its vocabulary)."""
    named = {"user": ids.user, "system": ids.system, "assistant": ids.assistant,
             IM_START: ids.im_start, IM_END: ids.im_end, AUDIO: ids.audio,
             AUDIO_START: ids.audio_start, AUDIO_END: ids.audio_end, IMAGE: ids.image,
             VIDEO: ids.video, VISION_START: ids.vision_start, VISION_END: ids.vision_end,
             "<tts_pad>": ids.tts_pad, "<tts_text_bos>": ids.tts_bos,
             "<tts_text_eod>": ids.tts_eos}
    wrong = {token: (tokenizer.token_to_id(token), wanted) for token, wanted in named.items()
             if tokenizer.token_to_id(token) != wanted}
    if wrong:
        raise ValueError(f"tokenizer ids differ from the configuration's (got, named): {wrong}")
    if tokenizer.get_vocab_size() > ids.vocab_size:
        raise ValueError(f"{tokenizer.get_vocab_size()} tokens outgrow the LM's "
                         f"{ids.vocab_size} rows")


def write_tiny_tokenizer(directory: Path) -> None:
    """tokenizer.json, tokenizer_config.json, chat_template.json (the processor's file) and
    preprocessor_config.json into the release `directory`."""
    directory = Path(directory)
    save_chatml_tokenizer(train_tokenizer(), directory, SPECIAL_TOKENS, CHAT_TEMPLATE, MAX_LENGTH)
    WhisperFeatureExtractor(feature_size=MEL_BINS).save_pretrained(directory)
