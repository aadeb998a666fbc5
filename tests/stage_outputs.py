"""What a stage hands on, read back out of the block pool in the family tests: a Thinker's
rows for its Talker, a VoiceBox job's PCM. Each block is released once read, as the stage
downstream would release it.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.stage import Stage, ThinkerOutput, VoiceBoxJob, VoiceBoxOutput
from pipeline.tensors.block_ref import BlockRef
from pipeline.tensors.shm import BlockPool


def thinker_rows(pool: BlockPool, outputs: list[ThinkerOutput]) -> torch.Tensor:
    """The outputs' Talker rows joined, their blocks released."""
    pieces = []
    for ref in (ref for out in outputs for ref in out.embeds):
        assert isinstance(ref, BlockRef), "the rows come in the pool's blocks"
        pieces.append(pool.view(ref).copy())
        pool.release(ref)
    return torch.from_numpy(np.concatenate(pieces))


async def voiced_pcm(stage: Stage[VoiceBoxJob, VoiceBoxOutput], pool: BlockPool,
                     job: VoiceBoxJob, sample_rate: int) -> np.ndarray:
    """The job's PCM: one output at `sample_rate`, its block released."""
    outputs = [out async for out in stage.stream(job)]
    assert len(outputs) == 1 and outputs[0].pcm is not None
    assert outputs[0].sample_rate == sample_rate
    pcm = pool.view(outputs[0].pcm).copy()
    pool.release(outputs[0].pcm)
    return pcm
