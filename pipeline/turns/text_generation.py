"""Text-only Thinker requests: a chat completion's reply, with no Talker and no VoiceBox.

The job goes to the same Thinker worker and engine as the calls' turns, through the same
`StageClient`, so it shares that engine's continuous batching with them. Leaving the iteration
early (a client that went away) aborts the request in the engine, as it does for a turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from pipeline.runtime.client import StageClient, release_quietly
from pipeline.stage import ThinkerJob, ThinkerOutput
from pipeline.tensors.cuda_ipc import CudaIpcRef
from pipeline.tensors.shm import BlockPool, BlockRef


async def generate_text(client: StageClient, pool: BlockPool, job: ThinkerJob
                        ) -> AsyncIterator[ThinkerOutput]:
    """Stream the Thinker's outputs for `job` (sent with embeds=False); the last one has
    finished=True. Raises the pipeline's errors (`StageFailedError`, `RequestFailedError`...)."""
    if job.embeds:
        raise ValueError("a text-only request asks for no embeddings (embeds=False)")
    async with aclosing(client.submit(job)) as outputs:
        async for output in outputs:
            assert isinstance(output, ThinkerOutput)  # a stage answers its own jobs
            _give_back(client, pool, output)
            yield output


def _give_back(client: StageClient, pool: BlockPool, output: ThinkerOutput) -> None:
    """Embeddings a family sent anyway (nobody voices a text reply) go straight back."""
    client.release_tensors([ref.transfer for ref in output.embeds if isinstance(ref, CudaIpcRef)],
                           delivered=False)
    for ref in output.embeds:
        if isinstance(ref, BlockRef):
            release_quietly(pool, ref)
