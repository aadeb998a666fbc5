"""A byte-level BPE trained locally on the built-in corpus (`corpus.py`), for the families'
tiny random-weight models: deterministic (same corpus, same merges), nothing downloaded."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pipeline.families.kit.corpus import CORPUS

# How often each of `train_bpe`'s whole words is added to the corpus: enough for their merges
# to be among the first learned (the corpus's own words appear a few times each).
WORD_REPEATS = 8


def train_bpe(vocab_size: int, special_tokens: Sequence[str] = (),
              words: Sequence[str] = ()) -> Tokenizer:
    """The BPE of `vocab_size` ids trained on the corpus, `special_tokens` its first ids.

    `words`: ordinary words the tokenizer must hold as one token each (a chat template's role
    names, which real tokenizers hold whole): each is added to the corpus on lines of its own,
    and a clear error is raised if one still takes several tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([*CORPUS.splitlines(), *list(words) * WORD_REPEATS], trainer)
    split = {word: tokens for word in words
             if len(tokens := tokenizer.encode(word, add_special_tokens=False).tokens) > 1}
    if split:
        raise ValueError(f"words the BPE of {vocab_size} ids does not hold whole: {split}")
    return tokenizer


def with_tokens_at(tokenizer: Tokenizer, places: Mapping[str, int]) -> Tokenizer:
    """The same BPE with each token of `places` at the id given, swapped with the token that
    had that id (a BPE's merges name tokens, not ids, so it encodes the same pieces)."""
    spec = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    token_of = {i: token for token, i in vocab.items()}
    for token, wanted in places.items():
        if token not in vocab or wanted not in token_of:
            raise ValueError(f"cannot place {token!r} at {wanted}: not in the BPE's vocabulary")
        other, held = token_of[wanted], vocab[token]
        vocab[token], vocab[other] = wanted, held
        token_of[wanted], token_of[held] = token, other
    return Tokenizer.from_str(json.dumps(spec))
