"""The shared-memory block pool, across real spawned processes (CUDA IPC: test_cuda_ipc_*.py)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import msgspec
import numpy as np
import pytest

from pipeline.tensors.shm import (
    BlockPool,
    BlockRef,
    PoolExhaustedError,
    StaleBlockError,
    TensorTooLargeError,
)

SPAWN = mp.get_context("spawn")
PAYLOAD_DTYPES = ["float32", "float64", "int16", "uint8", "int64", "bool", "complex64"]


def _payload(writer: int, index: int) -> np.ndarray:
    """A tensor both sides can rebuild from (writer, index): random dtype, shape and values."""
    rng = np.random.default_rng([writer, index])
    dtype = np.dtype(PAYLOAD_DTYPES[int(rng.integers(len(PAYLOAD_DTYPES)))])
    shape = tuple(int(d) for d in rng.integers(1, 24, size=int(rng.integers(1, 4))))
    return (rng.standard_normal(shape) * 100).astype(dtype)


@pytest.fixture
def make_pool() -> Iterator[Callable[[int, int], BlockPool]]:
    """Creates pools (block_count, block_size) with unique names; unlinks them afterwards."""
    pools: list[BlockPool] = []

    def make(count: int, size: int) -> BlockPool:
        pools.append(BlockPool.create(f"omnivox-test-{uuid.uuid4().hex[:12]}", count, size))
        return pools[-1]

    yield make
    for pool in pools:
        pool.close()
        pool.unlink()


@pytest.fixture
def pool(make_pool: Callable[[int, int], BlockPool]) -> BlockPool:
    return make_pool(4, 64 * 1024)


# ---- processes the tests spawn (module level, so spawn can import them) ----


def _writer(name: str, owner: int, count: int, refs: mp.Queue) -> None:
    pool = BlockPool.attach(name, owner)
    for index in range(count):
        ref = pool.write(_payload(owner, index), timeout=30)
        refs.put((owner, index, msgspec.msgpack.encode(ref)))
    pool.close()


def _reader(name: str, owner: int, expected: int, refs: mp.Queue, results: mp.Queue) -> None:
    pool = BlockPool.attach(name, owner)
    bad, seen = [], 0
    for _ in range(expected):
        writer, index, data = refs.get(timeout=60)
        ref = msgspec.msgpack.decode(data, type=BlockRef)
        view = pool.view(ref)
        if not np.array_equal(view, _payload(writer, index)) or view.dtype != ref.dtype:
            bad.append((writer, index))
        del view
        pool.release(ref)
        seen += 1
    results.put((seen, bad))
    pool.close()


def _negate_in_place(name: str, refs: mp.Queue, done: mp.Queue) -> None:
    pool = BlockPool.attach(name, 30)
    ref = refs.get(timeout=30)
    view = pool.view(ref)
    view *= -1  # through the child's view, into the parent's
    done.put(True)
    del view
    pool.close()


def _release_later(name: str, refs: mp.Queue, delay: float) -> None:
    pool = BlockPool.attach(name, 31)
    ref = refs.get(timeout=30)
    time.sleep(delay)
    pool.release(ref)
    pool.close()


def _hold_blocks(name: str, owner: int, count: int, refs: mp.Queue) -> None:
    pool = BlockPool.attach(name, owner)
    for index in range(count):
        refs.put(pool.write(np.full(100, index, np.int32), timeout=10))
    time.sleep(600)  # holds its blocks until killed


def _die_holding_the_lock(name: str, ready: mp.Queue) -> None:
    pool = BlockPool.attach(name, 50)
    with pool._lock:  # the pool's own header lock, held until this process is killed
        ready.put(True)
        time.sleep(600)


@pytest.mark.parametrize("dtype", [*PAYLOAD_DTYPES, "float16", "int8", "uint32"])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5), (2, 3, 4)])
def test_round_trip_keeps_values(pool: BlockPool, dtype: str, shape: tuple[int, ...]) -> None:
    array = (np.arange(int(np.prod(shape))).reshape(shape) * 3 - 5).astype(dtype)
    ref = pool.write(array, timeout=1)
    assert (ref.dtype, ref.shape, ref.nbytes) == (dtype, shape, array.nbytes)
    view = pool.view(ref)
    assert view.dtype == array.dtype and view.shape == shape
    np.testing.assert_array_equal(view, array)
    pool.release(ref)
    assert pool.in_use == 0


def test_strided_and_byte_swapped_inputs_arrive_as_native_contiguous(pool: BlockPool) -> None:
    base = np.arange(24, dtype=">i4").reshape(4, 6)
    ref = pool.write(base.T[::2], timeout=1)
    view = pool.view(ref)
    assert ref.dtype == "int32" and view.dtype.isnative and view.flags.c_contiguous
    np.testing.assert_array_equal(view, base.T[::2])


def test_view_is_zero_copy(pool: BlockPool) -> None:
    ref = pool.write(np.zeros((4, 4), np.float32), timeout=1)
    first, second = pool.view(ref), pool.view(ref)
    assert np.shares_memory(first, second)
    first[1, 2] = 42.0
    assert second[1, 2] == 42.0
    torch_view = pool.view_torch(ref)
    assert torch_view.data_ptr() == first.__array_interface__["data"][0]
    torch_view[0, 0] = -1.0
    assert first[0, 0] == -1.0


def test_torch_tensors_round_trip_including_bfloat16(pool: BlockPool) -> None:
    torch = pytest.importorskip("torch")
    for tensor in (torch.randn(5, 6).t(), torch.randn(3, 8, dtype=torch.bfloat16),
                   torch.arange(10, dtype=torch.int64), torch.rand(4, requires_grad=True)):
        ref = pool.write(tensor, timeout=1)
        assert ref.dtype == str(tensor.dtype).removeprefix("torch.")
        got = pool.view_torch(ref)
        assert got.dtype == tensor.dtype and torch.equal(got, tensor.detach())
        pool.release(ref)
    bf16 = pool.write(torch.ones(2, dtype=torch.bfloat16), timeout=1)
    with pytest.raises(TypeError, match="use view_torch"):
        pool.view(bf16)


def test_tensor_bigger_than_a_block_is_refused_naming_both_sizes(pool: BlockPool) -> None:
    with pytest.raises(TensorTooLargeError, match=r"80000 bytes .* block of 65536 bytes"):
        pool.write(np.zeros(10_000, np.float64), timeout=1)
    assert pool.in_use == 0


async def test_rows_past_a_block_go_in_pieces_that_join_byte_identical(
    make_pool: Callable,
) -> None:
    pool = make_pool(8, 4096)  # 8 rows a block of the tiny width (128 float32: 512 bytes)
    rows = np.random.default_rng(1).standard_normal((21, 128)).astype(np.float32)
    refs = await pool.put_rows(rows, timeout=1)
    assert [ref.shape for ref in refs] == [(8, 128), (8, 128), (5, 128)]
    assert np.concatenate([pool.view(ref) for ref in refs]).tobytes() == rows.tobytes()
    exact = await pool.put_rows(rows[:16], timeout=1)  # a multiple of a block: full blocks
    assert [ref.shape[0] for ref in exact] == [8, 8]
    (one,) = await pool.put_rows(rows[4:5], timeout=1)
    assert one.shape == (1, 128) and pool.view(one).tobytes() == rows[4:5].tobytes()
    assert await pool.put_rows(rows[:0], timeout=1) == []
    assert pool.in_use == 6
    for ref in [*refs, *exact, one]:
        pool.release(ref)


async def test_a_row_larger_than_a_block_is_refused_naming_the_setting(
    make_pool: Callable,
) -> None:
    pool = make_pool(4, 4096)
    real_width = np.zeros((2, 3584), np.float32)  # Qwen2.5-Omni-7B's thinker: 14,336 bytes
    with pytest.raises(TensorTooLargeError, match=r"a row of 14336 bytes does not fit a block "
                                                  r"of 4096 bytes .* pool\.block_size"):
        await pool.put_rows(real_width, timeout=1)
    assert pool.in_use == 0


async def test_rows_failing_midway_leave_no_block_held(make_pool: Callable) -> None:
    pool = make_pool(4, 4096)
    other = await pool.put(np.zeros(4), timeout=1)  # someone else's: 3 blocks free
    rows = np.ones((40, 128), np.float32)  # 5 blocks
    with pytest.raises(PoolExhaustedError):
        await pool.put_rows(rows, timeout=0.05)
    assert pool.block_count - pool.in_use == 3, "the 3 pieces put were released"
    waiting = asyncio.create_task(pool.put_rows(rows, timeout=30))
    while pool.in_use < pool.block_count:  # 3 pieces in, waiting for a 4th block
        await asyncio.sleep(0.005)
    waiting.cancel()  # as a barge-in cancels the turn's tasks
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert pool.block_count - pool.in_use == 3 and pool.view(other).shape == (4,)


def test_double_release_and_use_after_release_are_detected(pool: BlockPool) -> None:
    ref = pool.write(np.ones(3), timeout=1)
    pool.release(ref)
    with pytest.raises(StaleBlockError, match=f"block {ref.block} generation 0 .* released"):
        pool.release(ref)
    with pytest.raises(StaleBlockError):
        pool.view(ref)
    again = pool.write(np.ones(3), timeout=1)  # the same block, a new generation
    assert again.block == ref.block and again.generation == ref.generation + 1
    with pytest.raises(StaleBlockError):
        pool.release(ref)
    assert pool.in_use == 1


async def test_acquire_waits_then_raises_a_clear_error(pool: BlockPool) -> None:
    held = [pool.try_acquire() for _ in range(pool.block_count)]
    assert None not in held and pool.try_acquire() is None
    started = time.monotonic()
    with pytest.raises(PoolExhaustedError, match=r"all 4 blocks of 65536 bytes in use, none "
                                                 r"came free within 0.2 s .*\{1: 4\}"):
        await pool.acquire(timeout=0.2)
    assert time.monotonic() - started >= 0.2
    with pytest.raises(PoolExhaustedError):
        await pool.put(np.ones(4), timeout=0.05)
    with pytest.raises(PoolExhaustedError):
        pool.write(np.ones(4), timeout=0.05)


async def test_release_by_another_task_wakes_a_waiter(pool: BlockPool) -> None:
    refs = [await pool.put(np.full(8, i), timeout=1) for i in range(pool.block_count)]
    waiter = asyncio.create_task(pool.acquire(timeout=10))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    pool.release(refs[2])
    assert await waiter == refs[2].block


async def test_put_copies_large_tensors_off_the_loop(make_pool: Callable) -> None:
    pool = make_pool(2, 4 << 20)
    big = np.random.default_rng(0).standard_normal(400_000)  # 3.2 MB: copied in a thread
    ref = await pool.put(big, timeout=1)
    np.testing.assert_array_equal(pool.view(ref), big)
    with pytest.raises(TypeError, match="numeric dtypes only"):
        await pool.put(np.array(["text"], dtype=object), timeout=1)
    assert pool.in_use == 1


async def test_cancelling_a_put_mid_copy_gives_its_block_back(make_pool: Callable) -> None:
    pool = make_pool(2, 32 << 20)
    put = asyncio.create_task(pool.put(np.ones(4 << 20), timeout=1))  # 32 MiB: in a thread
    await asyncio.sleep(0)
    assert pool.in_use == 1  # acquired, copying
    put.cancel()  # as a barge-in cancels a turn's tasks
    with pytest.raises(asyncio.CancelledError):
        await put
    for _ in range(500):
        if pool.in_use == 0:
            break
        await asyncio.sleep(0.01)
    assert pool.in_use == 0


def test_writers_and_a_reader_in_spawned_processes_keep_data_intact(pool: BlockPool) -> None:
    per_writer = 40  # 80 tensors through 4 blocks: writers wait on the reader
    refs, results = SPAWN.Queue(maxsize=8), SPAWN.Queue()
    writers = [SPAWN.Process(target=_writer, args=(pool.name, owner, per_writer, refs))
               for owner in (11, 12)]
    reader = SPAWN.Process(target=_reader, args=(pool.name, 20, 2 * per_writer, refs, results))
    for process in (*writers, reader):
        process.start()
    seen, bad = results.get(timeout=120)
    for process in (*writers, reader):
        process.join(timeout=30)
        assert process.exitcode == 0
    assert seen == 2 * per_writer and bad == []
    assert pool.in_use == 0


def test_a_write_through_another_process_view_is_seen_here(pool: BlockPool) -> None:
    ref = pool.write(np.arange(16, dtype=np.float32), timeout=1)
    mine = pool.view(ref)
    refs, done = SPAWN.Queue(), SPAWN.Queue()
    child = SPAWN.Process(target=_negate_in_place, args=(pool.name, refs, done))
    child.start()
    refs.put(ref)
    assert done.get(timeout=60)
    child.join(timeout=30)
    np.testing.assert_array_equal(mine, -np.arange(16, dtype=np.float32))


async def test_release_in_another_process_wakes_a_waiter(pool: BlockPool) -> None:
    refs = [pool.write(np.ones(2), timeout=1) for _ in range(pool.block_count)]
    queue = SPAWN.Queue()
    child = SPAWN.Process(target=_release_later, args=(pool.name, queue, 0.3))
    child.start()
    queue.put(refs[1])
    assert await pool.acquire(timeout=60) == refs[1].block
    await asyncio.to_thread(child.join, 30)
    assert child.exitcode == 0


def test_reclaim_frees_what_a_killed_worker_held_and_old_refs_go_stale(pool: BlockPool) -> None:
    refs_queue = SPAWN.Queue()
    worker = SPAWN.Process(target=_hold_blocks, args=(pool.name, 7, 3, refs_queue))
    worker.start()
    refs = [refs_queue.get(timeout=60) for _ in range(3)]
    np.testing.assert_array_equal(pool.view(refs[0]), np.zeros(100, np.int32))  # handed over
    assert pool.held_by(7) == 2 and pool.held_by(pool.owner) == 1
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(timeout=30)
    assert worker.exitcode == -signal.SIGKILL
    assert pool.reclaim(7) == 2  # the supervisor, restarting worker 7
    assert pool.in_use == 1 and pool.reclaim(7) == 0
    for stale in refs[1:]:
        with pytest.raises(StaleBlockError, match="released or reclaimed"):
            pool.view(stale)
        with pytest.raises(StaleBlockError):
            pool.release(stale)
    pool.release(refs[0])  # what this process took over stayed valid
    restarted = BlockPool.attach(pool.name, 7)
    fresh = restarted.write(np.arange(3), timeout=1)
    assert fresh.generation > 0 and restarted.held_by(7) == 1
    restarted.release(fresh)
    restarted.close()
    assert pool.in_use == 0


def test_a_process_killed_inside_the_header_lock_does_not_wedge_the_pool(pool: BlockPool) -> None:
    ready = SPAWN.Queue()
    holder = SPAWN.Process(target=_die_holding_the_lock, args=(pool.name, ready))
    holder.start()
    assert ready.get(timeout=60)
    got: list[int | None] = []
    waiter = threading.Thread(target=lambda: got.append(pool.try_acquire()), daemon=True)
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and got == []  # excluded by the other process's lock
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(timeout=30)
    waiter.join(timeout=10)
    assert got == [0]


def test_attaching_from_an_unrelated_process_neither_unlinks_nor_warns(pool: BlockPool) -> None:
    script = ("import sys; from pipeline.tensors.shm import BlockPool; "
              f"p = BlockPool.attach({pool.name!r}, 40); p.release(p.write(__import__('numpy')"
              ".ones(3), timeout=1)); p.close()")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 0, done.stderr
    assert "resource_tracker" not in done.stderr and "leaked" not in done.stderr
    BlockPool.attach(pool.name, 41).close()  # the segment outlived the attacher


def test_the_transport_modules_do_not_import_torch() -> None:
    script = ("import sys, pipeline.tensors.shm, pipeline.tensors.cuda_ipc; "
              "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
