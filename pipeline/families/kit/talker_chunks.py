"""A Talker job as one chunk of its turn (the omni families' Talkers): where it sits in the
turn, and its rows, read out of its blocks and fed to the turn's state.

A turn's Talker jobs are its chunks, in order, request ids `call/turn/talker/<chunk>`: the turn
is the id without its chunk index (`turn_states.turn_of`; an id without an index is a turn of
its own), and chunk 0 starts it. Each job says how many leading rows of its embeddings are the
Thinker's prompt part (`TalkerJob.prompt_rows`: the first chunk's) and whether the reply text
ends with it (`TalkerJob.last`; such a job may carry no rows at all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from pipeline.families.kit.turn_states import turn_of
from pipeline.stage import StageContext, TalkerJob


@dataclass(frozen=True)
class ChunkInfo:
    """Where a Talker job sits in its turn."""

    turn: str  # the request id without its chunk index
    index: int
    prompt_rows: int  # leading rows of the job's embeddings that are the prompt part
    last: bool  # the reply text ends with this chunk


def chunk_info(job: TalkerJob) -> ChunkInfo:
    """The job's place in its turn, from its request id `call/turn/talker/<chunk>`."""
    index = job.request_id.rpartition("/")[2]
    position = int(index) if index.isdigit() else 0
    return ChunkInfo(turn_of(job.request_id) or job.request_id, position, job.prompt_rows,
                     job.last)


class FedTurn(Protocol):
    """A turn's state as the Thinker's rows reach it."""

    def add_prompt(self, rows: torch.Tensor) -> None:
        """The Thinker's prompt part."""

    def add_reply(self, rows: torch.Tensor) -> None:
        """Rows of the reply's text."""

    def end_text(self) -> None:
        """The reply's text has ended."""


def chunk_rows(ctx: StageContext, job: TalkerJob) -> torch.Tensor | None:
    """A copy of the job's rows (float32, CPU), its blocks released; in the torch thread."""
    if not job.text_embeds:
        return None
    with ctx.read_tensors(job.text_embeds) as embeds:
        return torch.as_tensor(embeds).to("cpu", torch.float32, copy=True)


def feed_chunk(turn: FedTurn, info: ChunkInfo, rows: torch.Tensor | None) -> None:
    """Give the turn a chunk's rows, the prompt part first, and the end of the text with the
    last chunk."""
    if rows is not None:
        if info.prompt_rows:
            turn.add_prompt(rows[:info.prompt_rows])
        turn.add_reply(rows[info.prompt_rows:])
    if info.last:
        turn.end_text()
