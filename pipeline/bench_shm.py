"""Benchmark of the block pool against pickling: one tensor moved between two spawned processes.

Three ways, each timed in the producer from start to the consumer's acknowledgement:
- `shm`: copy the tensor into a block, send its BlockRef over a Pipe, the consumer views and
  releases the block and acknowledges;
- `shm_inplace`: the same without the copy (a producer that writes its output straight into a
  block via `BlockPool.ref` + `view`): what the transport itself costs;
- `pickle`: send the ndarray itself over a Pipe (pickled, copied through the kernel).
Run `python -m pipeline.bench_shm` for a table.
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
_ACK = b"k"
_encode = msgspec.msgpack.Encoder().encode


def _send_copied(pool: BlockPool, conn: Connection, array: np.ndarray) -> None:
    conn.send_bytes(_encode(pool.write(array, timeout=10)))
    conn.recv_bytes()


def _send_inplace(pool: BlockPool, conn: Connection, array: np.ndarray) -> None:
    ref = pool.ref(pool.acquire_blocking(timeout=10), array.dtype.name, array.shape)
    conn.send_bytes(_encode(ref))
    conn.recv_bytes()


def _send_pickled(pool: BlockPool, conn: Connection, array: np.ndarray) -> None:
    conn.send(array)
    conn.recv_bytes()


_MODES: dict[str, Callable[[BlockPool, Connection, np.ndarray], None]] = {
    "shm": _send_copied, "shm_inplace": _send_inplace, "pickle": _send_pickled}


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
            times = []
            for _ in range(_WARMUP + repeats):
                started = time.perf_counter()
                send(pool, conn, array)
                times.append(time.perf_counter() - started)
            row[f"{mode}_s"] = statistics.median(times[_WARMUP:])
        rows.append(row)
    conn.send(("stop", 0))
    report.send(rows)
    pool.close()


def _consumer(name: str, conn: Connection) -> None:
    """Receives each mode's tensors as the stage on the other side would, acknowledging each."""
    pool, decoder = BlockPool.attach(name, owner=3), msgspec.msgpack.Decoder(BlockRef)
    while (message := conn.recv())[0] != "stop":
        mode, count = message
        for _ in range(count):
            if mode == "pickle":
                array = conn.recv()
            else:
                ref = decoder.decode(conn.recv_bytes())
                array = pool.view(ref)
                pool.release(ref)
            del array
            conn.send_bytes(_ACK)
    pool.close()


def shm_vs_pickle(sizes: list[int], repeats: int = 9) -> list[dict]:
    """Median seconds per tensor moved between two spawned processes, per size in bytes:
    [{bytes, shm_s, pickle_s, ratio, shm_inplace_s, inplace_ratio}] (ratio = pickle / shm)."""
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
        rows = report_in.recv()
        for process in processes:
            process.join(timeout=30)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        pool.close()
        pool.unlink()
    for row in rows:
        row["ratio"] = row["pickle_s"] / row["shm_s"]
        row["inplace_ratio"] = row["pickle_s"] / row["shm_inplace_s"]
    return rows


def main() -> None:
    print(f"{'bytes':>10} {'shm us':>10} {'inplace us':>11} {'pickle us':>11} {'ratio':>7} "
          f"{'inplace ratio':>14}")
    for row in shm_vs_pickle(DEFAULT_SIZES):
        print(f"{row['bytes']:>10} {row['shm_s'] * 1e6:>10.1f} {row['shm_inplace_s'] * 1e6:>11.1f}"
              f" {row['pickle_s'] * 1e6:>11.1f} {row['ratio']:>7.1f} {row['inplace_ratio']:>14.1f}")


if __name__ == "__main__":
    main()
