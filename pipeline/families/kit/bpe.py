"""A byte-level BPE trained locally on the built-in corpus (`corpus.py`), for the families'
tiny random-weight models: deterministic (same corpus, same merges), nothing downloaded."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pipeline.families.kit.corpus import CORPUS


def train_bpe(vocab_size: int, special_tokens: Sequence[str] = ()) -> Tokenizer:
    """The BPE of `vocab_size` ids trained on the corpus, `special_tokens` its first ids."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(), trainer)
    return tokenizer
