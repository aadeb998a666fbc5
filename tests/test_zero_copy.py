"""Zero-copy on the product path: producers write into leased blocks, consumers read views.

Real shared-memory pools and a real spawned consumer; block lifetimes are checked by taking
every free block and overwriting it while a reader still reads (a release that came before
the last read would hand the reader's block out, and the reader would see the overwrite).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from multiprocessing.connection import Connection

import msgspec
import numpy as np
import pytest

from pipeline.families.kit.queued_voicebox import QueuedVoiceBox
from pipeline.settings import PipelineSettings
from pipeline.stage import StageContext, VoiceBoxJob
from pipeline.tensors.shm import BlockPool, BlockRef, PoolExhaustedError
from pipeline.tensors.shm_lease import BlockLease
from pipeline.turns.events import Turn
from pipeline.turns.turn import TurnRun

SPAWN = mp.get_context("spawn")
BLOCKS, BLOCK_SIZE = 6, 1 << 16


@pytest.fixture
def pool() -> Iterator[BlockPool]:
    pool = BlockPool.create(f"omnivox-zero-copy-{uuid.uuid4().hex[:12]}", BLOCKS, BLOCK_SIZE)
    yield pool
    pool.close()
    pool.unlink()


def _overwrite_every_free_block(pool: BlockPool) -> list[BlockLease]:
    """Take every free block and fill it with a value no test writes (-7): the leases."""
    leases = []
    while True:
        try:
            lease = pool.lease_blocking((BLOCK_SIZE // 4,), "float32", timeout=0.001)
        except PoolExhaustedError:
            return leases
        lease.array[:] = -7.0
        leases.append(lease)


def _consume(name: str, conn: Connection) -> None:
    """A consumer process: views the block it is sent, answers what it read, releases it."""
    pool = BlockPool.attach(name, owner=3)
    ref = msgspec.msgpack.decode(conn.recv_bytes(), type=BlockRef)
    view = pool.view(ref)
    conn.send((pool.holds(view), view.tolist()))
    del view  # no view of the block outlives its release
    pool.release(ref)
    pool.close()


def test_a_leased_block_is_written_in_place_and_read_in_place_in_another_process(
    pool: BlockPool,
) -> None:
    source = np.arange(12, dtype=np.float32).reshape(3, 4)
    parent, child = SPAWN.Pipe()
    consumer = SPAWN.Process(target=_consume, args=(pool.name, child), daemon=True)
    consumer.start()
    try:
        with pool.lease_blocking((3, 4), "float32", timeout=1) as lease:
            np.multiply(source, 2.0, out=lease.array)  # the computation's last step
            assert pool.holds(lease.array), "the producer writes into the block itself"
            conn_ref = lease.send()
        parent.send_bytes(msgspec.msgpack.encode(conn_ref))
        assert parent.poll(30), "the consumer did not answer"
        shared, values = parent.recv()
        consumer.join(30)
    finally:
        if consumer.is_alive():
            consumer.kill()
    assert shared, "the consumer's array is a view of the pool block, not a copy"
    assert values == (source * 2).tolist()
    assert pool.in_use == 0, "the consumer released the block after reading it"


def test_a_lease_whose_write_fails_goes_back_and_a_sent_one_is_no_longer_writable(
    pool: BlockPool,
) -> None:
    with pytest.raises(ValueError), pool.lease_blocking((4,), "float32", timeout=1) as lease:
        lease.array[:] = np.ones(5)  # a shape bug in the writer
    assert pool.in_use == 0
    lease = pool.lease_blocking((4,), "int16", timeout=1)
    ref = lease.send()
    with pytest.raises(RuntimeError, match="already sent"):
        lease.array[0] = 1
    pool.release(ref)


async def test_read_tensors_reads_a_view_and_releases_only_after_the_last_read(
    pool: BlockPool,
) -> None:
    ctx = StageContext(pool, {}, "unused")
    with await ctx.acquire_tensor((2, 3)) as lease:
        lease.array[:] = [[1, 2, 3], [4, 5, 6]]
        ref = lease.send()
    with ctx.read_tensors([ref]) as rows:
        assert pool.holds(rows), "one piece is read in place"
        others = _overwrite_every_free_block(pool)  # a release before this read shows here
        assert rows.tolist() == [[1, 2, 3], [4, 5, 6]]
        assert pool.in_use == BLOCKS
    assert pool.in_use == len(others) == BLOCKS - 1, "released once the body ended"
    for other in others:
        other.release()


async def test_read_tensors_joins_several_pieces_and_releases_each(pool: BlockPool) -> None:
    ctx = StageContext(pool, {}, "unused")
    refs = [pool.write(np.full((n, 2), n, np.float32), 1) for n in (1, 2)]
    with ctx.read_tensors(refs) as rows:
        assert not pool.holds(rows), "a join is the one copy"
        assert rows[:, 0].tolist() == [1, 2, 2]
        assert pool.in_use == 2
    assert pool.in_use == 0


def test_the_sender_never_frees_a_block_its_reader_has_taken(pool: BlockPool) -> None:
    reader = BlockPool.attach(pool.name, owner=2)
    try:
        taken, viewed, untaken = (pool.write(np.ones(3), 1) for _ in range(3))
        view = reader.take_view(taken)  # the reader now holds the block until its last read
        assert not pool.release_unless_taken(taken), "the job ended; the reader still reads"
        reader.view(viewed)  # read, not taken over: its release stays with the sender
        assert pool.release_unless_taken(viewed)
        others = _overwrite_every_free_block(pool)
        assert view.tolist() == [1.0, 1.0, 1.0]
        del view
        reader.release(taken)
        assert pool.release_unless_taken(untaken), "never read: its sender gives it back"
        assert not pool.release_unless_taken(untaken), "and only once"
        for other in others:
            other.release()
        assert pool.in_use == 0
    finally:
        reader.close()


def test_the_turn_copies_voicebox_pcm_once_and_frees_the_block_at_once(
    pool: BlockPool,
) -> None:
    voicebox = BlockPool.attach(pool.name, owner=4)
    try:
        with voicebox.lease_blocking((480,), "float32", timeout=1) as lease:
            np.sin(np.linspace(0, 20, 480, dtype=np.float32), out=lease.array)
            expected, ref = lease.array.copy(), lease.send()
        run = TurnRun(Turn("t", [{"role": "user", "content": "hi"}]), {}, pool,
                      PipelineSettings())
        pcm = run._take("voicebox", ref)  # what the turn puts in its AudioChunk
        assert pool.in_use == 0, "the block is free once read: the call plays the copy"
        others = _overwrite_every_free_block(pool)  # the freed block, reused at once
        assert not pool.holds(pcm)
        np.testing.assert_array_equal(pcm, expected)
        for other in others:
            other.release()
    finally:
        voicebox.close()


class LeasingVoiceBox(QueuedVoiceBox):
    """Renders each job into a leased block (0.25 per sample, 10 per token), after `gate`."""

    task_label = "renderer"

    async def start(self, ctx: StageContext) -> None:
        self.gate = asyncio.Event()
        self.after_deliver: Callable[[], None] = lambda: None
        self._serve(ctx, 8_000)

    async def _render_jobs(self) -> None:
        while True:
            entry = await self.jobs.get()
            await self.gate.wait()
            with await self.ctx.acquire_tensor((10 * len(entry.job.tokens),)) as lease:
                lease.array.fill(0.25)
                entry.deliver(lease.send())
            self.after_deliver()

    def _close(self) -> None:
        pass


@pytest.fixture
async def voicebox(pool: BlockPool) -> AsyncIterator[LeasingVoiceBox]:
    stage = LeasingVoiceBox()
    await stage.start(StageContext(pool, {}, "unused"))
    yield stage
    await stage.stop()


async def _stream(stage: LeasingVoiceBox, job: VoiceBoxJob) -> list:
    return [out async for out in stage.stream(job)]


async def test_voicebox_pcm_rendered_into_a_block_arrives_intact_in_it(
    voicebox: LeasingVoiceBox, pool: BlockPool,
) -> None:
    voicebox.gate.set()
    (out,) = await _stream(voicebox, VoiceBoxJob("c/t/voicebox/0", [1, 2, 3]))
    pcm = pool.view(out.pcm)
    assert pool.holds(pcm) and pcm.tolist() == [0.25] * 30
    pool.release(out.pcm)


async def test_voicebox_blocks_rendered_for_a_job_nobody_waits_for_go_back(
    voicebox: LeasingVoiceBox, pool: BlockPool,
) -> None:
    aborted = asyncio.create_task(_stream(voicebox, VoiceBoxJob("c/a/voicebox/0", [1])))
    await asyncio.sleep(0.01)  # queued; the renderer holds it at the gate
    await voicebox.abort(["c/a/voicebox/0"])
    assert (await aborted)[0].pcm is None
    voicebox.gate.set()  # rendered anyway, answered to nobody
    await asyncio.sleep(0.01)
    assert pool.in_use == 0

    # Cancelled after its PCM came, before it could read it: the block goes back too.
    left = asyncio.create_task(_stream(voicebox, VoiceBoxJob("c/b/voicebox/0", [1])))
    voicebox.after_deliver = left.cancel
    with pytest.raises(asyncio.CancelledError):
        await left
    assert pool.in_use == 0
