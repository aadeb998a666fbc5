"""CUDA tensors between stages on a GPU host (elsewhere each test is skipped, saying why).

First two processes moving one tensor as the Thinker's and the Talker's workers do, with the
test in the API process's place between them; then the whole path across a real pipeline's
workers (tests/fake_family/cuda.py). The routing the API process does is tested on the CPU in
tests/test_cuda_ipc_transport.py.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
import uuid

import pytest

from pipeline.runtime.messages import (
    InspectReply,
    ReleaseTensors,
    client_decoder,
    encode,
    worker_decoder,
)
from pipeline.stage import StageContext, TalkerJob, ThinkerJob, ThinkerOutput
from pipeline.tensors.cuda_ipc import CudaIpcRef
from pipeline.tensors.shm import BlockPool
from pipeline.turns.events import AudioChunk, TextDelta, Turn, TurnDone
from pipeline.turns.orchestrator import Pipeline
from tests.fake_family import HIDDEN, SAMPLES_PER_TOKEN, reply_words

SPAWN = mp.get_context("spawn")
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
ROWS = 1024  # the tensor sent between two processes: (ROWS, HIDDEN) float32, row-major 0, 1, ...


def skip_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        reason = (f"CUDA IPC test skipped: torch.cuda.is_available() is False "
                  f"(torch {torch.__version__}, no CUDA device here)")
        with capsys.disabled():
            print(f"\n{reason}")
        pytest.skip(reason)


# ---- one tensor between two processes, through the stage context ----


def _thinker(pool_name: str, to_api: mp.Queue, from_api: mp.Queue) -> None:
    """The producing worker's side: `send_rows` of a CUDA tensor, then the API process's
    `ReleaseTensors` handled as the worker does; reports what it still holds."""
    import torch  # in the spawned child only

    pool = BlockPool.attach(pool_name, owner=5)
    ctx = StageContext(pool, {}, "unused", "thinker", cuda_ipc=True)
    source = torch.arange(ROWS * HIDDEN, dtype=torch.float32, device="cuda").reshape(ROWS, HIDDEN)
    refs = asyncio.run(ctx.send_rows(source))  # one export, however many rows
    source.zero_()  # the export is a clone: the consumer never sees this write
    to_api.put(encode(ThinkerOutput("c/t/thinker/0", embeds=refs)))
    release = client_decoder.decode(from_api.get(timeout=120))
    assert isinstance(release, ReleaseTensors)
    to_api.put((ctx.sender.release(release.transfers, release.delivered),
                ctx.sender.exporter.pending))
    pool.close()


def _talker(pool_name: str, to_api: mp.Queue, from_api: mp.Queue) -> None:
    """The consuming worker's side: the job's exports mapped as it arrives, read on the GPU
    (`read_tensors`), the maps dropped by the job's end; reports what it mapped, read, holds."""
    import torch  # before the job: a stage without torch refuses CUDA IPC pieces

    pool = BlockPool.attach(pool_name, owner=6)
    ctx = StageContext(pool, {}, "unused", "talker")
    job = client_decoder.decode(from_api.get(timeout=120))
    assert isinstance(job, TalkerJob)
    ctx.receive_job(job)
    mapped = ctx.imports.held
    expected = torch.arange(ROWS * HIDDEN, dtype=torch.float32, device="cuda").reshape(ROWS,
                                                                                      HIDDEN)
    with ctx.read_tensors(job.text_embeds) as read:
        intact = isinstance(read, torch.Tensor) and read.is_cuda and torch.equal(read, expected)
    del read
    ctx.end_job(job)
    to_api.put((mapped, intact, ctx.imports.held))
    pool.close()


def test_a_cuda_tensor_crosses_two_workers_as_an_export_and_is_freed_on_release(
    capsys: pytest.CaptureFixture[str],
) -> None:
    skip_without_cuda(capsys)
    pool = BlockPool.create(f"omnivox-cudaipc-{uuid.uuid4().hex[:10]}", 2, 1 << 12)
    from_thinker, to_thinker, from_talker, to_talker = (SPAWN.Queue() for _ in range(4))
    workers = [SPAWN.Process(target=_thinker, args=(pool.name, from_thinker, to_thinker)),
               SPAWN.Process(target=_talker, args=(pool.name, from_talker, to_talker))]
    try:
        for worker in workers:
            worker.start()
        output = worker_decoder.decode(from_thinker.get(timeout=120))
        assert isinstance(output, ThinkerOutput)
        (ref,) = output.embeds
        assert isinstance(ref, CudaIpcRef) and ref.stage == "thinker"
        assert (ref.shape, ref.dtype) == ((ROWS, HIDDEN), "float32")
        to_talker.put(encode(TalkerJob("c/t/talker/0", "x", [ref])))  # passed on unread
        # Mapped once as the job came, read intact on the GPU, no map left after the job.
        assert from_talker.get(timeout=120) == (1, True, 0)
        to_thinker.put(encode(ReleaseTensors([ref.transfer])))  # the job has ended
        assert from_thinker.get(timeout=120) == ([], 0)  # known, freed, nothing else held
        for worker in workers:
            worker.join(timeout=60)
            assert worker.exitcode == 0
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
        pool.close()
        pool.unlink()


# ---- the whole path across a real pipeline's workers ----


def cuda_settings() -> dict:
    return {
        "family": "tests.fake_family.cuda",
        "stages": {"thinker": {"token_s": 0.004}, "talker": {"token_s": 0.0005}},
        "pool": {"block_count": 64, "block_size": 1 << 16},
        "restart": {"max_attempts": 1, "stop_timeout_s": 5.0},
    }


async def _given_back(pipe: Pipeline, baseline: InspectReply) -> dict[str, InspectReply]:
    """Wait until the Thinker holds no export and no more GPU memory than at the start, and
    the Talker no map: every export was released and freed. The last replies."""
    deadline = time.monotonic() + 30
    while True:
        held = await pipe.active_requests()
        thinker, talker = held["thinker"], held["talker"]
        if (thinker.cuda_exports_pending == 0 and talker.cuda_imports_held == 0
                and thinker.cuda_allocated_bytes == baseline.cuda_allocated_bytes):
            return held
        assert time.monotonic() < deadline, f"exports never all given back: {held}"
        await asyncio.sleep(0.05)


def spoken_rows(events: list) -> list[int]:
    """The rows the Talker read, as the fake voice renders each token: 160 equal samples."""
    return [int(v) for e in events if isinstance(e, AudioChunk)
            for v in e.pcm[::SAMPLES_PER_TOKEN]]


async def test_cuda_tensors_cross_stages_by_cuda_ipc_and_are_all_given_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    skip_without_cuda(capsys)
    async with Pipeline(cuda_settings()) as pipe:
        assert pipe.health().ready, pipe.health()
        baseline = (await pipe.active_requests())["thinker"]
        assert baseline.cuda_exports_pending == 0 and baseline.cuda_allocated_bytes > 0

        # Straight from the Thinker's worker: each embedding is a CUDA IPC export naming it.
        client = pipe._clients["thinker"]
        outputs = [out async for out in client.submit(
            ThinkerJob("direct/1/thinker/0", MESSAGES, max_tokens=6))]
        refs = [ref for out in outputs for ref in out.embeds]
        assert len(refs) == 6
        assert all(isinstance(r, CudaIpcRef) and r.stage == "thinker" and r.shape == (1, HIDDEN)
                   and r.dtype == "float32" for r in refs), refs
        assert (await pipe.active_requests())["thinker"].cuda_exports_pending == 6
        client.release_tensors([r.transfer for r in refs], delivered=False)  # never mapped
        await _given_back(pipe, baseline)

        # Whole turns: the Talker got every row on the GPU, intact and in order.
        for n in (30, 45):
            events = [e async for e in pipe.respond(Turn(f"cuda{n}", MESSAGES, max_tokens=n))]
            assert isinstance(events[-1], TurnDone), events[-1]
            assert "".join(e.text for e in events if isinstance(e, TextDelta)) == " ".join(
                reply_words(n))
            assert spoken_rows(events) == list(range(n))
        turns = await asyncio.gather(*(
            _collect(pipe, Turn(f"conc{i}", MESSAGES, max_tokens=10 + 5 * i)) for i in range(4)))
        for i, events in enumerate(turns):
            assert isinstance(events[-1], TurnDone) and spoken_rows(events) == list(
                range(10 + 5 * i))
        await _given_back(pipe, baseline)

        # Cancelled mid-turn: exports in the Talker's job, the chunker and the late outputs.
        events = pipe.respond(Turn("cuda-cancel", MESSAGES, max_tokens=400))
        async for event in events:
            if isinstance(event, AudioChunk):
                break
        assert (await pipe.active_requests())["thinker"].cuda_exports_pending > 0
        assert await pipe.cancel("cuda-cancel")
        assert [e async for e in events] == []  # nothing more of that turn
        held = await _given_back(pipe, baseline)
        assert not [r for reply in held.values() for r in reply.serving_ids if "cuda-cancel" in r]
        events = await _collect(pipe, Turn("after-cancel", MESSAGES, max_tokens=12))
        assert isinstance(events[-1], TurnDone) and spoken_rows(events) == list(range(12))
        await _given_back(pipe, baseline)


async def _collect(pipe: Pipeline, turn: Turn) -> list:
    return [event async for event in pipe.respond(turn)]
