"""How likely a caller's words so far are a whole turn, as a chat model sees it.

A chat template closes each user message with a token of its own (`<|im_end|>` in ChatML). The
probability the model gives that token right after the caller's words is its judgement that
they finished speaking: high after "What is the capital of France?", low after "I'd like to
book a table for". Small turn-detector models are trained for exactly this; an instruction-tuned
Thinker already knows it from its chat data, so the profile's own model scores it.
"""

from __future__ import annotations

import math
from typing import Any


def end_of_turn_prompt(tokenizer: Any, messages: list[dict[str, str]],
                       words: str) -> tuple[list[int], int]:
    """Token ids of the chat-templated `messages` with the caller's `words` as the last user
    message, up to those words; and the token the template closes that message with."""
    if not words:
        raise ValueError("no words to score")
    conversation = [*messages, {"role": "user", "content": words}]
    text = tokenizer.apply_chat_template(conversation, tokenize=False,
                                         add_generation_prompt=False)
    cut = text.rindex(words) + len(words)
    prefix = tokenizer.encode(text[:cut], add_special_tokens=False)
    closing = tokenizer.encode(text[cut:], add_special_tokens=False)
    if not closing:
        raise ValueError("the chat template closes a user message with no token")
    return prefix, closing[0]


def probability(logprobs: dict[int, float], token: int) -> float:
    """`token`'s probability among the likeliest next tokens; 0 when it is not one of them
    (less likely than every one of them: no judgement turns on that difference)."""
    return math.exp(logprobs[token]) if token in logprobs else 0.0
