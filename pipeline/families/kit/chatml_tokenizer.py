"""The chat tokenizer files of a tiny omni release (qwen25_omni's and qwen3_omni's
`tiny_tokenizer.py`): ChatML with an audio part, saved in the Hugging Face layout.

The chat template writes the Qwen chat layout both releases use: each message
`<|im_start|>role\\n` content `<|im_end|>\\n`, a content list's audio part as the family's
audio placeholder between its delimiters, its text parts as they are, and the assistant's
header `<|im_start|>assistant\\n` to prompt a reply. It is the published templates' layout for
these messages, without their tool-call and reasoning branches, which the stages never render.
The files are tokenizer.json, tokenizer_config.json (a fast tokenizer: no bos, <|im_end|> its
eos, <|endoftext|> its pad, the other special tokens additional) and chat_template.json, the
processor's file, which the prompt builder reads first (`audio_prompt.release_chat_template`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"


def chatml_template(audio_part: str) -> str:
    """The ChatML chat template, a content list's audio part written as `audio_part` (the
    family's placeholder between its delimiters)."""
    return (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' }}"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}"
        f"{{% if part['type'] == 'audio' %}}{{{{ '{audio_part}' }}}}"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
        "{% endfor %}{% endif %}"
        "{{ '<|im_end|>\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


def save_chatml_tokenizer(tokenizer: Tokenizer, directory: Path, special_tokens: Sequence[str],
                          chat_template: str, max_length: int) -> None:
    """tokenizer.json, tokenizer_config.json and chat_template.json into `directory`
    (`special_tokens`: the tokenizer's added ones, PAD among them)."""
    directory = Path(directory)
    tokenizer.save(str(directory / "tokenizer.json"))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None, "eos_token": IM_END, "pad_token": PAD, "unk_token": None,
        "additional_special_tokens": [token for token in special_tokens if token != PAD],
        "chat_template": chat_template,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "chat_template.json").write_text(
        json.dumps({"chat_template": chat_template}, indent=2) + "\n")
