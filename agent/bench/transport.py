"""Benchmark of the block pool against pickling: one tensor moved between two spawned processes.

Three ways, each timed in the producer from start to the consumer's acknowledgement, the
consumer reading the tensor's last element (written last) back in it:
- `shm_inplace`, the product's own path and the headline figure: lease a block
  (`BlockPool.lease`, what `StageContext.acquire_tensor` does), write the tensor into it in
  place, send the ref over a Pipe; the consumer reads a view and releases the block. The write
  is not counted: it stands for the producer's computation, whose last step writes into the
  block instead of into memory of its own (the VoiceBox's tanh, the Thinker's lookup);
- `shm`: copy a tensor the producer already has into a block (`BlockPool.write`, what
  `StageContext.send_tensor` does for one), then the same; the copy is counted;
- `pickle`: send the ndarray itself over a Pipe (pickled, copied through the kernel);
- `shm_ref`: `shm_inplace` writing only the last element, what the transport alone costs. It
  is flat in size; `shm_inplace` rises a little at 16-64 MiB, as a write that large leaves
  both processes' caches cold for the round trip after it (no data moves).
Run `python -m agent.bench.transport` for a table.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
import uuid
from collections.abc import Callable
from multiprocessing.connection import Connection

import msgspec
import numpy as np

from pipeline.shm import BlockPool, BlockRef

DEFAULT_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
_WARMUP = 2  # first rounds map pages and warm caches in both processes; not counted
_encode = msgspec.msgpack.Encoder().encode


def _send_inplace(pool: BlockPool, conn: Connection, array: np.ndarray) -> float:
    started = time.perf_counter()
    with pool.lease_blocking(array.shape, array.dtype.name, timeout=10) as lease:
        writing = time.perf_counter()
        np.copyto(lease.array, array)  # the computation's last step (not counted)
        written = time.perf_counter()
        conn.send_bytes(_encode(lease.send()))
    _check_ack(conn, array)
    return time.perf_counter() - started - (written - writing)


def _send_ref(pool: BlockPool, conn: Connection, array: np.ndarray) -> float:
    started = time.perf_counter()
    with pool.lease_blocking(array.shape, array.dtype.name, timeout=10) as lease:
        lease.array[-1:] = array[-1:]  # the element the consumer reads back, and no more
        conn.send_bytes(_encode(lease.send()))
    _check_ack(conn, array)
    return time.perf_counter() - started


def _send_copied(pool: BlockPool, conn: Connection, array: np.ndarray) -> float:
    started = time.perf_counter()
    conn.send_bytes(_encode(pool.write(array, timeout=10)))
    _check_ack(conn, array)
    return time.perf_counter() - started


def _send_pickled(pool: BlockPool, conn: Connection, array: np.ndarray) -> float:
    started = time.perf_counter()
    conn.send(array)
    _check_ack(conn, array)
    return time.perf_counter() - started


def _check_ack(conn: Connection, array: np.ndarray) -> None:
    """The consumer answers with the tensor's last element as it read it."""
    if conn.recv_bytes() != array[-1:].tobytes():
        raise RuntimeError("the consumer read something other than what was sent")


_MODES: dict[str, Callable[[BlockPool, Connection, np.ndarray], float]] = {
    "shm_inplace": _send_inplace, "shm": _send_copied, "pickle": _send_pickled,
    "shm_ref": _send_ref}


def _producer(name: str, sizes: list[int], repeats: int, conn: Connection,
              report: Connection) -> None:
    """Times every mode at every size; sends one row per size to the parent."""
    pool = BlockPool.attach(name, owner=2)
    rows = []
    for size in sizes:
        array = np.random.default_rng(size).standard_normal(max(size // 4, 1), dtype=np.float32)
        row: dict[str, float] = {"bytes": array.nbytes}
        for mode, send in _MODES.items():
            conn.send((mode, _WARMUP + repeats))
            times = [send(pool, conn, array) for _ in range(_WARMUP + repeats)]
            row[f"{mode}_s"] = statistics.median(times[_WARMUP:])
        rows.append(row)
    conn.send(("stop", 0))
    report.send(rows)
    pool.close()


def _consumer(name: str, conn: Connection) -> None:
    """Receives each mode's tensors as the stage on the other side would, acknowledging each
    with the last element it read (of a view of the block, released after that read)."""
    pool, decoder = BlockPool.attach(name, owner=3), msgspec.msgpack.Decoder(BlockRef)
    while (message := conn.recv())[0] != "stop":
        mode, count = message
        for _ in range(count):
            if mode == "pickle":
                last = conn.recv()[-1:].tobytes()
            else:
                ref = decoder.decode(conn.recv_bytes())
                last = pool.view(ref)[-1:].tobytes()
                pool.release(ref)
            conn.send_bytes(last)
    pool.close()


def shm_vs_pickle(sizes: list[int], repeats: int = 31) -> list[dict]:
    """Median seconds per tensor moved between two spawned processes, per size in bytes:
    [{bytes, shm_inplace_s, inplace_ratio, shm_s, ratio, pickle_s, shm_ref_s}], each ratio
    being pickle's time over that path's; `shm_inplace` is the product's path (module doc)."""
    spawn = mp.get_context("spawn")
    pool = BlockPool.create(f"omnivox-bench-{uuid.uuid4().hex[:12]}", 2, max(sizes))
    producer_end, consumer_end = spawn.Pipe()
    report_in, report_out = spawn.Pipe(duplex=False)
    processes = [
        spawn.Process(target=_consumer, args=(pool.name, consumer_end), daemon=True),
        spawn.Process(target=_producer, args=(pool.name, sizes, repeats, producer_end,
                                              report_out), daemon=True)]
    try:
        for process in processes:
            process.start()
        if not report_in.poll(600):
            raise TimeoutError("benchmark processes gave no result within 600 s")
        rows: list[dict] = report_in.recv()  # what _producer sends
        for process in processes:
            process.join(timeout=30)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        pool.close()
        pool.unlink()
    for row in rows:
        row["inplace_ratio"] = row["pickle_s"] / row["shm_inplace_s"]
        row["ratio"] = row["pickle_s"] / row["shm_s"]
    return rows


def main() -> None:
    print(f"{'bytes':>10} {'in place us':>12} {'pickle us':>11} {'ratio':>7}   "
          f"{'copy first us':>14} {'ratio':>7} {'ref alone us':>13}")
    for row in shm_vs_pickle(DEFAULT_SIZES):
        print(f"{row['bytes']:>10} {row['shm_inplace_s'] * 1e6:>12.1f} "
              f"{row['pickle_s'] * 1e6:>11.1f} {row['inplace_ratio']:>7.1f}   "
              f"{row['shm_s'] * 1e6:>14.1f} {row['ratio']:>7.1f} {row['shm_ref_s'] * 1e6:>13.1f}")


if __name__ == "__main__":
    main()
