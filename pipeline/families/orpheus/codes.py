"""Orpheus's speech-token ids and SNAC codes: the id layout, frames, and SNAC's codebooks.

Orpheus extends Llama 3's vocabulary: 128256 + k is `<custom_token_k>`; the first ten are its
control ids, and from AUDIO_BASE (`<custom_token_10>`) on come 7 x 4096 audio ids, one range
of 4096 per position in a 7-token frame. So the i-th audio token of an utterance carries the
code `id - AUDIO_BASE - (i mod 7) * 4096`. A frame spreads over SNAC's three codebooks at
1, 2 and 4 codes per frame, in the order the reference decoders use.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

AUDIO_BASE = 128266  # <custom_token_10>: the first audio id
CODEBOOK_SIZE = 4096
FRAME = 7  # audio tokens per frame
AUDIO_IDS = range(AUDIO_BASE, AUDIO_BASE + FRAME * CODEBOOK_SIZE)
# The frame positions of each SNAC codebook's codes, in time order (1, 2 and 4 a frame).
BOOK_POSITIONS = ((0,), (1, 4), (2, 3, 5, 6))


def code_of(token_id: int, index: int) -> int | None:
    """The code the `index`-th audio token of an utterance carries; None if the id is not in
    the range its frame position allows."""
    code = token_id - AUDIO_BASE - (index % FRAME) * CODEBOOK_SIZE
    return code if 0 <= code < CODEBOOK_SIZE else None


class FrameAssembler:
    """Turns one utterance's streamed ids into whole frames of codes.

    An id outside its position's range is skipped without taking the position (the reference
    decoders skip ids below the audio range so; an id past it would make them drop a whole
    window). A trained model never emits one; a random-weight one mostly does.
    """

    def __init__(self) -> None:
        self.codes: list[int] = []  # of the frame being filled
        self.skipped = 0

    def feed(self, token_ids: Iterable[int]) -> list[list[int]]:
        """The frames these ids complete (each 7 codes)."""
        frames = []
        for token_id in token_ids:
            code = code_of(token_id, len(self.codes))
            if code is None:
                self.skipped += 1
                continue
            self.codes.append(code)
            if len(self.codes) == FRAME:
                frames.append(self.codes)
                self.codes = []
        return frames


def codebooks(frames: torch.Tensor) -> list[torch.Tensor]:
    """SNAC's three code tensors, (batch, n), (batch, 2n) and (batch, 4n), of (batch, n, 7)
    frames."""
    return [frames[..., list(positions)].flatten(-2) for positions in BOOK_POSITIONS]
