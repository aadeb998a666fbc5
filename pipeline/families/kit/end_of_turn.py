"""How likely a caller's words so far are a whole turn, as a chat model sees it.

The words as the recogniser heard them, less the punctuation it closed them with (Whisper puts
a "?" after "Can you tell me how to get to" as readily as after a finished question), go into
the chat template as the caller's message, left open. The model's probability that the next
token ends the sentence (".", "?", "!") or the message (the template's closing token) is its
judgement that the caller finished: 0.86-0.99 after "Where do penguins live", 0.000 after "I'd
like to book a table for" with SmolLM2-135M. Small turn-detector models are trained for
exactly this; an instruction-tuned Thinker knows it from its chat data, so the profile's own
model scores it.
"""

from __future__ import annotations

import math
from typing import Any

SENTENCE_ENDS = ("?", "!", ".")
TRAILING = " \t\n.?!,;:…"  # what a recogniser closes an utterance with


def end_of_turn_prompt(tokenizer: Any, messages: list[dict[str, str]], heard: str,
                       chat_template: str | None = None) -> tuple[list[int], int] | None:
    """Token ids of the chat-templated `messages` with the caller's words as the last user
    message, left open after them; and the token the template closes that message with.
    None when `heard` holds no words. `chat_template`: the model's, when its tokenizer has
    none of its own (a Qwen2.5-Omni release keeps it in the processor's file)."""
    words = heard.rstrip(TRAILING)
    if not words:
        return None
    conversation = [*messages, {"role": "user", "content": words}]
    text = tokenizer.apply_chat_template(conversation, chat_template=chat_template,
                                         tokenize=False, add_generation_prompt=False)
    cut = text.rindex(words) + len(words)
    prefix = tokenizer.encode(text[:cut], add_special_tokens=False)
    closing = tokenizer.encode(text[cut:], add_special_tokens=False)
    if not closing:
        raise ValueError("the chat template closes a user message with no token")
    return prefix, closing[0]


def ends_sentence(tokenizer: Any, token: int) -> bool:
    """Whether `token` ends a sentence ("?", "!", "." but not an ellipsis, which trails off)."""
    text = tokenizer.decode([token]).strip()
    return text[:1] in SENTENCE_ENDS and not text.startswith("..")


def probability(tokenizer: Any, logprobs: dict[int, float], closing: int) -> float:
    """The probability that the next token ends the sentence or the message, summed over the
    likeliest next tokens (those less likely than all of them count for nothing)."""
    return min(1.0, sum(math.exp(logprob) for token, logprob in logprobs.items()
                        if token == closing or ends_sentence(tokenizer, token)))
