"""A recited reply's pieces: the text as the Thinker's tokenizer splits it, whole characters."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from pipeline.families.kit.recite import REPLACEMENT, recited_pieces
from pipeline.families.tiny.tokenizer import save_tokenizer, train_tokenizer


def test_pieces_join_to_the_text_with_no_half_characters(tmp_path: Path) -> None:
    save_tokenizer(train_tokenizer(512), tmp_path, model_max_length=2048)  # the tiny family's
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    text = "Ça va? 3.5 km — très bien, 東京 ✓."
    pieces = list(recited_pieces(tokenizer, text))
    assert "".join(piece for piece, _ in pieces) == text
    assert [t for _, ids in pieces for t in ids] == tokenizer.encode(text,
                                                                     add_special_tokens=False)
    assert all(piece and REPLACEMENT not in piece for piece, _ in pieces)
    # A 512-token vocabulary spells rare characters in bytes: some piece holds several tokens.
    assert max(len(ids) for _, ids in pieces) > 1
