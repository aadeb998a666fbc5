"""CUDA tensors between stages, on the CPU: the wire, the chunker, the stage context, and the API
process's routing of exports and their releases (on a GPU host: tests/test_cuda_ipc_gpu.py).

The CPU tests use CudaIpcRef structs made here: they are only ever mapped by a consuming
worker, so everything the API process does with them runs without a GPU. The routing tests put
the real StageClient and TurnRun in front of scripted workers (real zmq sockets, decoding with
the workers' own decoder), to see exactly which releases reach which worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import msgspec
import numpy as np
import pytest
import zmq
import zmq.asyncio

from pipeline.errors import PipelineBusyError
from pipeline.runtime.client import StageClient
from pipeline.runtime.messages import (
    Abort,
    Aborted,
    Inspect,
    InspectReply,
    ReleaseTensors,
    client_decoder,
    encode,
    worker_decoder,
)
from pipeline.settings import PipelineSettings
from pipeline.stage import (
    Job,
    StageContext,
    TalkerJob,
    TalkerOutput,
    ThinkerJob,
    ThinkerOutput,
    VoiceBoxOutput,
)
from pipeline.tensors.cuda_ipc import CudaIpcRef
from pipeline.tensors.shm import BlockPool, BlockRef, StaleBlockError, TensorTooLargeError
from pipeline.turns.cascade import ClauseChunker, Piece
from pipeline.turns.events import AudioChunk, TextDelta, Turn, TurnDone
from pipeline.turns.turn import TurnRun
from tests.fake_family import HIDDEN, reply_words

TRANSFER_BASE = 7 << 32  # transfer ids of the exports made here (as a worker's random base)
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def export(i: int, stage: str = "thinker") -> CudaIpcRef:
    """The CudaIpcRef a Thinker worker would send for token i's (1, HIDDEN) embedding."""
    return CudaIpcRef(TRANSFER_BASE + i, "float32", (1, HIDDEN), (HIDDEN, 1), 0, 0,
                      f"handle-{i}".encode(), 4 * HIDDEN, 512 * i, b"/torch_1_2", i, None,
                      False, stage)


async def until(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.fixture
def pool() -> Iterator[BlockPool]:
    pool = BlockPool.create(f"omnivox-cudaipc-{uuid.uuid4().hex[:10]}", 32, 1 << 14)
    yield pool
    pool.close()
    pool.unlink()


# ---- the wire and the chunker ----


def test_jobs_and_outputs_carry_blocks_and_cuda_exports_across_the_wire() -> None:
    block = BlockRef(3, 1, "float32", (2, HIDDEN), 2 * 4 * HIDDEN)
    job = TalkerJob("c/t/talker/0", "Hello there,", [block, export(0), export(1), block])
    got = client_decoder.decode(encode(job))
    assert got == job and [type(p) for p in got.text_embeds] == [BlockRef, CudaIpcRef,
                                                                 CudaIpcRef, BlockRef]
    assert got.text_embeds[1].stage == "thinker"
    assert client_decoder.decode(encode(TalkerJob("c/t/talker/1", "x"))).text_embeds == []
    rest = BlockRef(4, 2, "float32", (1, HIDDEN), 4 * HIDDEN)  # rows in two blocks
    for embeds in ([export(5)], [block, rest], []):
        out = ThinkerOutput("c/t/thinker/0", text=" hi", token_ids=[5], embeds=embeds)
        assert worker_decoder.decode(encode(out)) == out
    release = ReleaseTensors([TRANSFER_BASE + 1, TRANSFER_BASE + 2], delivered=False)
    assert client_decoder.decode(encode(release)) == release
    assert client_decoder.decode(encode(ReleaseTensors([5]))).delivered is True
    reply = InspectReply(1, [], ["r"], cuda_exports_pending=3, cuda_imports_held=1,
                         cuda_allocated_bytes=512)
    assert worker_decoder.decode(encode(reply)) == reply
    with pytest.raises(msgspec.ValidationError, match="Expected `int`"):
        client_decoder.decode(encode({"type": "release_tensors", "transfers": ["x"]}))


def test_chunker_keeps_cuda_exports_in_order_and_joins_only_arrays() -> None:
    words = ["Hello", " there", ",", " this", " is", " it", "."]
    chunker, chunks = ClauseChunker(first_chars=8, min_chars=8, max_chars=40), []
    for i, text in enumerate(words):  # tokens 2 and 3 came as arrays, the others as exports
        embeds = np.full((1, HIDDEN), i, np.float32) if i in (2, 3) else export(i)
        if chunk := chunker.feed(Piece(text, (i,), (embeds,))):
            chunks.append(chunk)
    chunks.append(chunker.flush())
    assert [c.text for c in chunks] == ["Hello there,", " this is it."]
    first, second = chunks
    assert first.parts == (export(0), export(1), first.parts[2])
    np.testing.assert_array_equal(first.parts[2], np.full((1, HIDDEN), 2, np.float32))
    assert isinstance(second.parts[0], np.ndarray) and second.parts[1:] == (
        export(4), export(5), export(6))
    assert second.parts[0][:, 0].tolist() == [3]
    assert first.embeds is None and second.embeds is None  # not all arrays: no single array
    arrays_only = ClauseChunker()
    arrays_only.feed(Piece("One", (0,), (np.zeros((1, 4), np.float32),)))
    arrays_only.feed(Piece(" two", (1,), (np.ones((1, 4), np.float32),)))
    chunk = arrays_only.flush()
    (joined,) = chunk.parts
    assert chunk.embeds is joined  # all arrays: one array, as before CUDA IPC existed
    np.testing.assert_array_equal(joined[:, 0], [0, 1])


# ---- the stage context, on the CPU ----


async def test_stage_context_sends_cpu_tensors_through_the_pool(pool: BlockPool) -> None:
    torch = pytest.importorskip("torch")
    thinker = StageContext(pool, {}, "unused", "thinker", cuda_ipc=True)
    talker = StageContext(pool, {}, "unused", "talker")
    for tensor in (np.arange(6, dtype=np.float32).reshape(2, 3),
                   torch.arange(6, dtype=torch.float32).reshape(2, 3)):
        ref = await thinker.send_tensor(tensor)
        assert isinstance(ref, BlockRef)  # not on CUDA: the pool, whatever the consumer
        (wire,) = client_decoder.decode(encode(TalkerJob("c/t/talker/0", "x", [ref]))).text_embeds
        assert wire == ref
        with talker.read_tensors([wire]) as read:  # the consumer's path: a view of the block
            assert pool.holds(read)
            np.testing.assert_array_equal(read, np.arange(6).reshape(2, 3))
        assert pool.in_use == 0  # released after the last read
        ref = await thinker.send_tensor(tensor)
        np.testing.assert_array_equal(talker.take_tensors([ref]), np.arange(6).reshape(2, 3))
    assert thinker.sender.exporter.pending == 0 and pool.in_use == 0


async def test_stage_context_sends_rows_over_as_many_blocks_as_they_need(
    pool: BlockPool,
) -> None:
    torch = pytest.importorskip("torch")
    thinker = StageContext(pool, {}, "unused", "thinker", cuda_ipc=True)
    talker = StageContext(pool, {}, "unused", "talker")
    rows = np.arange(1200 * HIDDEN, dtype=np.float32).reshape(1200, HIDDEN)  # 512 a block
    for tensor in (rows, torch.from_numpy(rows)):  # on the CPU: blocks, whatever the consumer
        refs = await thinker.send_rows(tensor)
        assert [ref.shape[0] for ref in refs] == [512, 512, 176]
        out = ThinkerOutput("c/t/thinker/0", token_ids=[1], embeds=refs)
        wire = worker_decoder.decode(encode(out)).embeds
        assert talker.take_tensors(wire).tobytes() == rows.tobytes()
        assert pool.in_use == 0
    with pytest.raises(TensorTooLargeError, match=r"pool\.block_size"):
        await thinker.send_rows(np.zeros((3, 4097), np.float32))  # one row past a block
    assert pool.in_use == 0


async def test_take_tensors_joins_blocks_and_releases_each(pool: BlockPool) -> None:
    ctx = StageContext(pool, {}, "unused", "talker")
    refs = [await pool.put(np.full((n, HIDDEN), n, np.float32), 1.0) for n in (1, 3, 2)]
    joined = ctx.take_tensors(refs)
    assert isinstance(joined, np.ndarray) and joined[:, 0].tolist() == [1, 3, 3, 3, 2, 2]
    assert pool.in_use == 0
    with pytest.raises(StaleBlockError):
        pool.release(refs[1])  # already given back
    with pytest.raises(ValueError, match="no tensor pieces"):
        ctx.take_tensors([])
    pytest.importorskip("torch")
    with pytest.raises(StaleBlockError, match="not mapped here"):
        ctx.take_tensors([export(1)])  # a job's exports are mapped as it arrives, or never
    assert ctx.imports.held == 0


# ---- the API process's routing, in front of scripted workers ----


class ScriptedWorker:
    """A stage worker's socket whose answers a test scripts: it records every job, abort and
    release the API process's side sends it, decoded with the workers' own decoder."""

    def __init__(self, endpoint: str,
                 serve: Callable[[ScriptedWorker, bytes, Job], Awaitable[None]]) -> None:
        self.serve = serve
        self.sock = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.jobs: list[Job] = []
        self.read: list[int] = []  # what a scripted Talker read from its jobs' pieces
        self.sent: list[Any] = []
        self.releases: list[ReleaseTensors] = []
        self.aborted: set[str] = set()
        self.serving: set[asyncio.Task[None]] = set()
        self._loop = asyncio.create_task(self._receive())

    async def _receive(self) -> None:
        while True:
            identity, payload = await self.sock.recv_multipart()
            msg = client_decoder.decode(payload)
            if isinstance(msg, ReleaseTensors):
                self.releases.append(msg)
            elif isinstance(msg, Abort):
                self.aborted.update(msg.request_ids)
                if msg.ack:
                    await self.send(identity, Aborted(msg.ack))
            elif isinstance(msg, Inspect):
                await self.send(identity, InspectReply(msg.ack, [], []))
            else:
                self.jobs.append(msg)
                task = asyncio.create_task(self.serve(self, identity, msg))
                self.serving.add(task)
                task.add_done_callback(self.serving.discard)

    async def send(self, identity: bytes, msg: Any) -> None:
        self.sent.append(msg)
        await self.sock.send_multipart([identity, encode(msg)])

    def released(self, delivered: bool) -> list[int]:
        return [t for r in self.releases if r.delivered == delivered for t in r.transfers]

    def exports_sent(self, request_id: str | None = None) -> list[int]:
        return [ref.transfer for m in self.sent for ref in getattr(m, "embeds", [])
                if isinstance(ref, CudaIpcRef) and request_id in (None, m.request_id)]

    async def close(self) -> None:
        tasks = [self._loop, *self.serving]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.sock.close()


def thinker_script(pool: BlockPool, pace_s: float = 0.0, block_every: int = 0) -> Callable:
    """Token i of the worker's job k carries export(1000 * k + i), or (every `block_every`-th
    token) a block whose row is i."""

    async def think(worker: ScriptedWorker, identity: bytes, job: ThinkerJob) -> None:
        words, offset = reply_words(job.max_tokens), 1000 * (len(worker.jobs) - 1)
        for i, word in enumerate(words):
            if job.request_id in worker.aborted:
                break
            if block_every and i % block_every == 0:
                embeds = [await pool.put(np.full((1, HIDDEN), i, np.float32), 1.0)]
            else:
                embeds = [export(offset + i)]
            await worker.send(identity, ThinkerOutput(job.request_id, text=word if i == 0 else
                                                      " " + word, token_ids=[i], embeds=embeds))
            await asyncio.sleep(pace_s)
        await worker.send(identity, ThinkerOutput(job.request_id, finished=True))

    return think


def talker_script(pool: BlockPool, hold_first: bool = False) -> Callable:
    """Reads the job's pieces (the rows of blocks, the token of exports) into `worker.read`."""

    async def talk(worker: ScriptedWorker, identity: bytes, job: TalkerJob) -> None:
        read = []
        for piece in job.text_embeds:
            if isinstance(piece, BlockRef):
                read += [int(v) for v in pool.view(piece)[:, 0]]
            else:
                read.append(piece.transfer - TRANSFER_BASE)
        worker.read += read
        if hold_first and len(worker.jobs) == 1:
            while job.request_id not in worker.aborted:
                await asyncio.sleep(0.005)
            return  # an aborted job sends nothing more
        await worker.send(identity, TalkerOutput(job.request_id, tokens=[len(read)],
                                                 finished=True))

    return talk


async def voice(worker: ScriptedWorker, identity: bytes, job: Job) -> None:
    await worker.send(identity, VoiceBoxOutput(job.request_id, finished=True))


@contextlib.asynccontextmanager
async def scripted_stages(pool: BlockPool, queue_size: int = 1024, **scripts: Callable
                          ) -> AsyncIterator[tuple[dict[str, ScriptedWorker],
                                                   dict[str, StageClient]]]:
    """Scripted workers for these stages and a connected StageClient for each."""
    directory = tempfile.mkdtemp(prefix="ovx-")
    workers, clients = {}, {}
    try:
        for stage, script in scripts.items():
            endpoint = f"ipc://{directory}/{stage}.sock"
            workers[stage] = ScriptedWorker(endpoint, script)
            clients[stage] = StageClient(stage, endpoint, pool, queue_size=queue_size)
            clients[stage].connect()
        await asyncio.gather(*(client.wait_connected() for client in clients.values()))
        yield workers, clients
    finally:
        for client in clients.values():
            await client.close()
        for worker in workers.values():
            await worker.close()
        shutil.rmtree(directory, ignore_errors=True)


async def events_of(run: TurnRun) -> list:
    events: list = []
    while not events or not isinstance(events[-1], TurnDone):
        event = await asyncio.wait_for(run.events.get(), 30)
        assert isinstance(event, TextDelta | AudioChunk | TurnDone), event  # not TurnFailed
        events.append(event)
    return events


async def test_exports_ride_their_talker_job_and_go_back_when_it_ends(pool: BlockPool) -> None:
    async with scripted_stages(pool, thinker=thinker_script(pool, block_every=4),
                               talker=talker_script(pool), voicebox=voice) as (workers, clients):
        run = TurnRun(Turn("t1", MESSAGES, max_tokens=30), clients, pool, PipelineSettings())
        run.start()
        events = await events_of(run)
        assert events[-1].text == " ".join(reply_words(30))
        thinker, talker = workers["thinker"], workers["talker"]
        # Every token's embedding reached the Talker once, in order, whichever way it came.
        assert talker.read == list(range(30))
        exported = thinker.exports_sent()
        assert len(exported) == 30 - len(range(0, 30, 4))
        carried = [p for job in talker.jobs for p in job.text_embeds if isinstance(p, CudaIpcRef)]
        assert carried == [export(t - TRANSFER_BASE) for t in exported]  # passed on untouched
        # One release per Talker job, after it ended, naming exactly its exports.
        await until(lambda: len(thinker.releases) == len(talker.jobs), "a release per job")
        assert [sorted(r.transfers) for r in thinker.releases] == [
            sorted(p.transfer for p in job.text_embeds if isinstance(p, CudaIpcRef))
            for job in talker.jobs]
        assert thinker.released(delivered=False) == []
        assert all(not w.releases for w in (talker, workers["voicebox"]))
        assert pool.in_use == 0  # the blocks are given back as before


def prompt_script(pool: BlockPool, prompt: int) -> Callable:
    """A Thinker whose first token carries `prompt` prompt rows before its own (as qwen25_omni's
    does), every output's rows sent with a real stage context's `send_rows`; the turn's row r
    is r throughout."""
    ctx = StageContext(pool, {}, "unused", "thinker")

    async def think(worker: ScriptedWorker, identity: bytes, job: ThinkerJob) -> None:
        first = 0
        for i, word in enumerate(reply_words(job.max_tokens)):
            count = prompt + 1 if i == 0 else 1
            rows = np.repeat(np.arange(first, first + count, dtype=np.float32)[:, None], HIDDEN, 1)
            first += count
            await worker.send(identity, ThinkerOutput(
                job.request_id, text=word if i == 0 else " " + word, token_ids=[i],
                embeds=await ctx.send_rows(rows), prompt_rows=prompt if i == 0 else 0))
        await worker.send(identity, ThinkerOutput(job.request_id, finished=True))

    return think


async def test_prompt_rows_past_a_block_cross_both_hops_in_pieces(pool: BlockPool) -> None:
    """1,500 prompt rows where a block holds 512: the Thinker's output comes in pieces, the
    turn joins its chunk's rows and puts them in as many blocks again, and the Talker reads
    every row once, in order; every block is given back."""
    prompt = 1500
    async with scripted_stages(pool, thinker=prompt_script(pool, prompt),
                               talker=talker_script(pool), voicebox=voice) as (workers, clients):
        run = TurnRun(Turn("t5", MESSAGES, max_tokens=20), clients, pool, PipelineSettings())
        run.start()
        events = await events_of(run)
        assert events[-1].text == " ".join(reply_words(20))
        thinker, talker = workers["thinker"], workers["talker"]
        assert len(thinker.sent[0].embeds) == 3, "the first output: 1,501 rows in 3 blocks"
        assert talker.read == list(range(prompt + 20))
        first = talker.jobs[0]
        assert first.prompt_rows == prompt and len(first.text_embeds) >= 3
        assert all(ref.nbytes <= pool.block_size for job in talker.jobs
                   for ref in job.text_embeds)
        await until(lambda: pool.in_use == 0, "every block given back")


async def test_a_cancelled_turn_gives_every_export_back_exactly_once(pool: BlockPool) -> None:
    async with scripted_stages(pool, thinker=thinker_script(pool, pace_s=0.002),
                               talker=talker_script(pool, hold_first=True),
                               voicebox=voice) as (workers, clients):
        thinker, talker = workers["thinker"], workers["talker"]
        run = TurnRun(Turn("t2", MESSAGES, max_tokens=400), clients, pool, PipelineSettings())
        run.start()
        await until(lambda: talker.jobs, "the first Talker job")
        await until(lambda: len(thinker.exports_sent()) > 20, "exports the turn still holds")
        await run.cancel()
        await until(lambda: not thinker.serving, "the Thinker's script to stop")
        sent = thinker.exports_sent()
        assert len(sent) < 400  # it stopped on the abort
        await until(lambda: len(thinker.released(True) + thinker.released(False)) == len(sent),
                    "every export given back")
        given_back = thinker.released(True) + thinker.released(False)
        assert sorted(given_back) == sorted(sent)  # all of them, none twice
        (job,) = talker.jobs
        # The one delivered to the Talker goes back as delivered (its worker gives torch's
        # count back); the chunker's, the channel's and the late outputs' never reached one.
        assert sorted(thinker.released(True)) == sorted(p.transfer for p in job.text_embeds)
        assert set(thinker.released(False)).isdisjoint(thinker.released(True))


async def test_outputs_nobody_reads_give_their_exports_back_undelivered(pool: BlockPool) -> None:
    async with scripted_stages(pool, queue_size=8, thinker=thinker_script(pool)) as (
            workers, clients):
        thinker, client = workers["thinker"], clients["thinker"]
        # A reader takes one output and leaves: the queued and the late ones go back.
        outputs = client.submit(ThinkerJob("c/t3/thinker/0", MESSAGES, max_tokens=7))
        (kept,) = [ref.transfer for ref in (await anext(outputs)).embeds]
        await outputs.aclose()
        await until(lambda: not thinker.serving, "the Thinker's script to stop")
        unread = set(thinker.exports_sent("c/t3/thinker/0")) - {kept}
        assert unread
        await until(lambda: set(thinker.released(False)) == unread, "the unread given back")
        client.release_tensors([kept])  # the reader's own, once done with it: delivered
        await until(lambda: thinker.released(True) == [kept], "the reader's release")

        # A reader that falls behind: the client ends its request, aborts it in the worker
        # and gives back every export it was sent, then or later, except the one read.
        behind, read = client.submit(ThinkerJob("c/t4/thinker/0", MESSAGES, max_tokens=50)), []
        with pytest.raises(PipelineBusyError):
            async for out in behind:  # the first output may come before the overflow, or not
                read += [ref.transfer for ref in out.embeds]
                await until(lambda: "c/t4/thinker/0" in thinker.aborted, "the client's abort")
        await until(lambda: not thinker.serving, "the Thinker's script to stop")
        unread |= set(thinker.exports_sent("c/t4/thinker/0")) - set(read)
        await until(lambda: set(thinker.released(False)) == unread, "the unread given back")
        released = thinker.released(False) + thinker.released(True)
        assert len(released) == len(set(released)), "none given back twice"
        assert not set(read) & set(released)
