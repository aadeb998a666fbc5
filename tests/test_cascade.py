"""The cascade's clause chunker: where Thinker text is cut into Talker chunks."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pipeline.turns.cascade import Chunk, ClauseChunker, Piece


def chunk_all(pieces: list[str], **kw) -> list[Chunk]:
    chunker, chunks = ClauseChunker(**kw), []
    for i, text in enumerate(pieces):
        embeds = np.full((1, 4), i, np.float32)
        if chunk := chunker.feed(Piece(text, (i,), (embeds,))):
            chunks.append(chunk)
    if last := chunker.flush():
        chunks.append(last)
    return chunks


def test_first_chunk_is_short_and_later_ones_end_at_clauses() -> None:
    pieces = ["Sure", ",", " the", " library", " opens", " at", " nine", " in", " the",
              " morning", ",", " and", " closes", " at", " five", ".", " Anything", " else", "?"]
    chunks = chunk_all(pieces, first_chars=16, min_chars=24, max_chars=160)
    assert [c.text for c in chunks] == [
        "Sure,", " the library opens at nine in the morning,",
        " and closes at five. Anything else?"]  # " and closes at five." is under min_chars
    assert chunks[1].token_ids == tuple(range(2, 11))
    assert chunks[1].embeds[:, 0].tolist() == list(range(2, 11))  # its own tokens' rows


def test_no_cut_inside_numbers_and_a_long_clause_is_cut_at_a_word() -> None:
    chunks = chunk_all(["It", " costs", " 3", ".", "5", " euros", " today"] + [" word"] * 40,
                       first_chars=20, min_chars=10, max_chars=30)
    assert chunks[0].text.startswith("It costs 3.5 euros")
    assert all(len(c.text) <= 30 + len(" word") for c in chunks)


def test_with_growth_a_long_clause_waits_no_longer_than_the_text_before_it_allows() -> None:
    words = ["The", " story", " of", " Romeo", " and", " Juliet", " by", " William",
             " Shakespeare", " is", " attributed", " to", " a", " French", " playwright", "."]
    assert len(chunk_all(words, first_chars=16, min_chars=24, max_chars=160)) == 2
    chunks = chunk_all(words, first_chars=16, min_chars=24, max_chars=160, growth=2.0)
    assert [c.text for c in chunks] == [
        "The story of Romeo",  # then at most 2 x 18 = 36 chars (to the word past it)
        " and Juliet by William Shakespeare is",  # then 2 x 55 = 110: the clause ends first
        " attributed to a French playwright."]
    short = chunk_all(["Sure", ",", " the", " library", " opens", " at", " nine", " in"],
                      first_chars=16, min_chars=24, max_chars=160, growth=2.0)
    assert [c.text for c in short] == ["Sure,", " the library opens at nine", " in"]


def test_in_a_hurry_a_later_chunk_is_cut_like_a_first_one() -> None:
    """When the caller is about to run dry, the next cut comes at the first clause or word past
    first_chars, not at a clause past min_chars; once the hurry is over the clause rule holds."""
    pieces = ["Sure", ",", " the", " library", " opens", " at", " nine", " in", " the",
              " morning", ",", " and", " closes", " at", " five", ".", " Anything", " else", "?"]
    chunker, texts = ClauseChunker(first_chars=16, min_chars=24, max_chars=160), []
    for i, text in enumerate(pieces):
        if chunk := chunker.feed(Piece(text), hurry=3 <= i <= 6):
            texts.append(chunk.text)
    texts.append(chunker.flush().text)
    assert texts == ["Sure,", " the library opens", " at nine in the morning,",
                     " and closes at five. Anything else?"]


def test_whitespace_alone_is_never_a_chunk() -> None:
    chunks = chunk_all(["\n"] * 5 + ["Hi", "."])
    assert [c.text for c in chunks] == ["\n\n\n\n\nHi."]


@given(st.lists(st.text(alphabet="ab .,!\n", min_size=1, max_size=6), max_size=60),
       st.sampled_from([None, 0.5, 2.0]))
def test_chunks_tile_the_reply(pieces: list[str], growth: float | None) -> None:
    text = "".join(pieces)
    chunks = chunk_all(pieces, first_chars=4, min_chars=6, max_chars=12, growth=growth)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    position = 0
    for chunk in chunks:
        assert chunk.start == position and text[chunk.start:chunk.end] == chunk.text
        assert chunk.text.strip()
        position = chunk.end
    assert not text[position:].strip()  # only trailing whitespace is left unvoiced


def test_a_closing_flush_always_ends_the_reply_with_a_marked_chunk() -> None:
    """For a Talker that carries a turn's state across chunks: the prompt part's rows stay with
    the first chunk, the last chunk is marked and carries the stop token's row (no text), and
    a reply with nothing left still ends with a marked, empty chunk."""
    chunker = ClauseChunker(first_chars=4)
    # 2 prompt rows, then "Hello"'s, received in two pieces (two blocks)
    prompt_and_first = (np.zeros((2, 4), np.float32), np.full((1, 4), 5, np.float32))
    assert chunker.feed(Piece("Hello", (0,), prompt_and_first, prompt_rows=2)) is None
    first = chunker.feed(Piece(" there.", (1,), (np.ones((1, 4), np.float32),)))
    assert first is not None and first.prompt_rows == 2 and not first.last
    assert first.embeds is not None and first.embeds[:, 0].tolist() == [0, 0, 5]
    assert chunker.feed(Piece("", (9,), (np.full((1, 4), 9, np.float32),))) is None  # stop
    last = chunker.flush(closing=True)
    assert last is not None and last.last and last.text == " there."
    assert last.token_ids == (1, 9) and last.prompt_rows == 0
    assert last.embeds is not None and last.embeds[:, 0].tolist() == [1, 9]
    assert ClauseChunker().flush() is None
    empty = ClauseChunker().flush(closing=True)
    assert empty is not None and empty.last and empty.parts == () and empty.text == ""
