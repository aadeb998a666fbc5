"""The tiny Qwen2.5-Omni release's tokenizer: a byte-level BPE with the real special tokens.

The BPE is trained locally on the kit's built-in corpus (`kit/bpe.py`; deterministic: same
corpus, same merges); the special tokens Qwen2.5-Omni's prompts use are added after the BPE
vocabulary, where the real tokenizer has them. The speaker tokens stand in for the real
release's per-speaker text-start tokens (`spk_dict.pt`'s `bos_token`); their names are ours.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from pipeline.families.kit.bpe import train_bpe
from pipeline.families.kit.chatml_tokenizer import (
    IM_END,
    IM_START,
    PAD,
    chatml_template,
    save_chatml_tokenizer,
)
from pipeline.families.qwen25_omni.tiny_config import TokenIds

BPE_SIZE = 448
VOCAB_SIZE = 512  # the LM's rows: the tokenizer's length rounded up, as the real release does
AUDIO, AUDIO_BOS, AUDIO_EOS = "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"
VISION_BOS, VISION_EOS, IMAGE, VIDEO = "<|vision_bos|>", "<|vision_eos|>", "<|IMAGE|>", "<|VIDEO|>"
TTS_PAD, TTS_BOS, TTS_EOS = "<|tts_pad|>", "<|tts_bos|>", "<|tts_eos|>"
VISION_PAD = "<|vision_pad|>"
SPEAKERS = {"Chelsie": "<|spk_chelsie|>", "Ethan": "<|spk_ethan|>"}
SPECIAL_TOKENS = [PAD, IM_START, IM_END, AUDIO, AUDIO_BOS, AUDIO_EOS, VISION_BOS, VISION_EOS,
                  IMAGE, VIDEO, TTS_PAD, TTS_BOS, TTS_EOS, *SPEAKERS.values(), VISION_PAD]

# Qwen2.5-Omni's chat format: the kit's ChatML, an audio part the <|AUDIO|> placeholder between
# its delimiters (the prompt builder widens it to one row per audio-tower frame).
CHAT_TEMPLATE = chatml_template(AUDIO_BOS + AUDIO + AUDIO_EOS)
MAX_LENGTH = 4096  # tokenizer_config.json's model_max_length


def train_tokenizer() -> Tokenizer:
    """The kit's BPE on the corpus, then the special tokens appended after it."""
    tokenizer = train_bpe(BPE_SIZE)
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return tokenizer


def token_ids(tokenizer: Tokenizer) -> TokenIds:
    """The ids the model configuration names."""
    def id_of(token: str) -> int:
        found = tokenizer.token_to_id(token)
        if found is None:
            raise KeyError(f"tokenizer has no {token!r}")
        return int(found)

    user = tokenizer.encode("user", add_special_tokens=False).ids
    return TokenIds(
        vocab_size=VOCAB_SIZE, pad=id_of(PAD), im_end=id_of(IM_END), audio=id_of(AUDIO),
        audio_bos=id_of(AUDIO_BOS), audio_eos=id_of(AUDIO_EOS), image=id_of(IMAGE),
        video=id_of(VIDEO), vision_bos=id_of(VISION_BOS), vision_eos=id_of(VISION_EOS),
        vision_pad=id_of(VISION_PAD),
        tts_pad=id_of(TTS_PAD), tts_bos=id_of(TTS_BOS), tts_eos=id_of(TTS_EOS), user=user[0])


def save_tokenizer(tokenizer: Tokenizer, directory: Path) -> None:
    """tokenizer.json, tokenizer_config.json and chat_template.json (the processor's file)."""
    save_chatml_tokenizer(tokenizer, directory, SPECIAL_TOKENS, CHAT_TEMPLATE, MAX_LENGTH)
