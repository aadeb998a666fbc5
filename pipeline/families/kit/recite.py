"""A recited reply: given text voiced as if the Thinker had written it (speech synthesis).

The text is tokenized with the Thinker's own tokenizer and handed on token by token, each piece
with the text it adds, so the cascade cuts and the Talker voices it exactly as it would a reply
the model wrote. A piece's text is what decoding the tokens so far adds to the text before it;
a token that ends inside a multi-byte character joins the next one, so no piece carries half a
character.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

REPLACEMENT = "\ufffd"  # what a tokenizer decodes half of a multi-byte character to


def recited_pieces(tokenizer: Any, text: str) -> Iterator[tuple[str, list[int]]]:
    """(text, token ids) pieces that join to `text` as the tokenizer decodes it."""
    ids: list[int] = list(tokenizer.encode(text, add_special_tokens=False))
    said, start = "", 0
    for end in range(1, len(ids) + 1):
        decoded = tokenizer.decode(ids[:end])
        if decoded.endswith(REPLACEMENT) and end < len(ids):
            continue  # the character goes on in the next token
        yield decoded[len(said):], ids[start:end]
        said, start = decoded, end
