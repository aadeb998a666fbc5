"""The tiny Thinker's text tokenizer: the kit's byte-level BPE (`kit/bpe.py`), trained locally.

It is saved in the Hugging Face layout (tokenizer.json + tokenizer_config.json with a ChatML
chat template), so vLLM and `transformers` load it exactly as they load a real model's.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from pipeline.families.kit.bpe import train_bpe

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
AUDIO = "<|audio|>"  # placeholder where the caller's encoded audio is spliced into the prompt
SPECIAL_TOKENS = [PAD, IM_START, IM_END, AUDIO]  # ids 0..3, in this order

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer(vocab_size: int) -> Tokenizer:
    """The kit's BPE on the corpus, the special tokens its first ids (deterministic)."""
    return train_bpe(vocab_size, SPECIAL_TOKENS)


def save_tokenizer(tokenizer: Tokenizer, directory: Path, model_max_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json (special tokens, chat template)."""
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": PAD,
        "unk_token": None,
        "additional_special_tokens": [IM_START, AUDIO],
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
