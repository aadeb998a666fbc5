"""Benchmark of the block pool against pickling: one tensor moved between two spawned processes.

Each way is timed in the producer from start to the consumer's acknowledgement, the consumer
reading the tensor's last element (written last) back in it:
- `shm_inplace`, the product's own path and the headline figure: lease a block
  (`BlockPool.lease`, what `StageContext.acquire_tensor` does), write the tensor into it in
  place, send the ref over a Pipe; the consumer reads a view and releases the block. The write
  is not counted: it stands for the producer's computation, whose last step writes into the
  block instead of into memory of its own (the VoiceBox's tanh, the Thinker's lookup);
- `shm_pause`, its control, timed in turns with it: the same round trip, the write replaced by
  a busy wait as long as the write before it took, so nothing is written. What `shm_inplace`
  gains with size, `shm_pause` gains too: a larger tensor takes longer to write, and a round
  trip after a longer wait costs more (the consumer, idle meanwhile, wakes later and runs
  slower on colder caches), whatever the wait was spent on. No step of the path is sized:
  no copy, no page fault (the block's pages are mapped once, in the warm-up), views in O(1);
- `shm`: copy a tensor the producer already has into a block (`BlockPool.write`, what
  `StageContext.send_tensor` does for one), then the same; the copy is counted;
- `pickle`: send the ndarray itself over a Pipe (pickled, copied through the kernel);
- `shm_ref`: `shm_inplace` writing only the last element, back to back: the transport alone.
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

from pipeline.tensors.shm import BlockPool, BlockRef

DEFAULT_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
FLAT_FROM = 64 << 10  # the smallest size the product path's flatness is judged from
_WARMUP = 2  # first rounds map pages and warm caches in both processes; not counted
_encode = msgspec.msgpack.Encoder().encode
Round = dict[str, float]  # one round's figures, in seconds, by name


def _send_leased(pool: BlockPool, conn: Connection, array: np.ndarray,
                 fill: Callable[[np.ndarray], None]) -> tuple[float, float]:
    """A block leased, `fill`ed (not counted: the computation), its ref sent, the read awaited:
    (seconds counted, seconds `fill` took)."""
    started = time.perf_counter()
    with pool.lease_blocking(array.shape, array.dtype.name, timeout=10) as lease:
        filling = time.perf_counter()
        fill(lease.array)
        filled = time.perf_counter()
        conn.send_bytes(_encode(lease.send()))
    _check_ack(conn, array)
    return time.perf_counter() - started - (filled - filling), filled - filling


def _send_inplace_and_paused(pool: BlockPool, conn: Connection, array: np.ndarray) -> Round:
    """The product's path, then its control: the same after a wait as long as its write."""
    inplace, write = _send_leased(pool, conn, array, lambda block: np.copyto(block, array))

    def wait_then_write_last(block: np.ndarray) -> None:
        until = time.perf_counter() + write
        while time.perf_counter() < until:  # busy, as the producer computing would be
            pass
        block[-1:] = array[-1:]

    return {"shm_inplace_s": inplace, "write_s": write,
            "shm_pause_s": _send_leased(pool, conn, array, wait_then_write_last)[0]}


def _send_ref(pool: BlockPool, conn: Connection, array: np.ndarray) -> Round:
    def write_last(block: np.ndarray) -> None:
        block[-1:] = array[-1:]  # the element the consumer reads back, and no more

    return {"shm_ref_s": _send_leased(pool, conn, array, write_last)[0]}


def _send_copied(pool: BlockPool, conn: Connection, array: np.ndarray) -> Round:
    started = time.perf_counter()
    conn.send_bytes(_encode(pool.write(array, timeout=10)))
    _check_ack(conn, array)
    return {"shm_s": time.perf_counter() - started}


def _send_pickled(pool: BlockPool, conn: Connection, array: np.ndarray) -> Round:
    started = time.perf_counter()
    conn.send(array)
    _check_ack(conn, array)
    return {"pickle_s": time.perf_counter() - started}


def _check_ack(conn: Connection, array: np.ndarray) -> None:
    """The consumer answers with the tensor's last element as it read it."""
    if conn.recv_bytes() != array[-1:].tobytes():
        raise RuntimeError("the consumer read something other than what was sent")


# Each way: how one round goes, and how many tensors it sends.
_MODES: dict[str, tuple[Callable[[BlockPool, Connection, np.ndarray], Round], int]] = {
    "shm_inplace": (_send_inplace_and_paused, 2), "shm": (_send_copied, 1),
    "pickle": (_send_pickled, 1), "shm_ref": (_send_ref, 1)}


def _producer(name: str, sizes: list[int], repeats: int, conn: Connection,
              report: Connection) -> None:
    """Times every mode at every size; sends one row of medians per size to the parent."""
    pool = BlockPool.attach(name, owner=2)
    rows = []
    for size in sizes:
        array = np.random.default_rng(size).standard_normal(max(size // 4, 1), dtype=np.float32)
        row: dict[str, float] = {"bytes": array.nbytes}
        for mode, (send, tensors) in _MODES.items():
            conn.send((mode, (_WARMUP + repeats) * tensors))
            rounds = [send(pool, conn, array) for _ in range(_WARMUP + repeats)][_WARMUP:]
            row.update({key: statistics.median(r[key] for r in rounds) for key in rounds[0]})
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
    [{bytes, shm_inplace_s, inplace_ratio, shm_pause_s, write_s, shm_s, ratio, pickle_s,
    shm_ref_s}], each ratio being pickle's time over that path's; `shm_inplace` is the
    product's path, `shm_pause` its control, `write_s` the write it does not count (module
    doc)."""
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


def size_cost_ms(rows: list[dict]) -> tuple[float, float] | None:
    """The product path less its control (the same pause, nothing written), lowest and highest
    over the sizes from FLAT_FROM up, in ms: what size itself costs on the path."""
    judged = [(row["shm_inplace_s"] - row["shm_pause_s"]) * 1e3
              for row in rows if row["bytes"] >= FLAT_FROM]
    return (min(judged), max(judged)) if judged else None


def print_table(rows: list[dict], indent: str = "") -> None:
    """The rows of `shm_vs_pickle` in milliseconds, and what the product path's growth is."""
    print(f"{indent}{'bytes':>10} {'product path':>12} {'same pause':>10} {'(write)':>9} "
          f"{'pickle':>9} {'ratio':>6}   {'copy first':>10} {'ratio':>6} {'ref alone':>9}")
    for row in rows:
        print(f"{indent}{row['bytes']:>10} {row['shm_inplace_s'] * 1e3:>12.3f} "
              f"{row['shm_pause_s'] * 1e3:>10.3f} {row['write_s'] * 1e3:>9.3f} "
              f"{row['pickle_s'] * 1e3:>9.3f} {row['inplace_ratio']:>6.1f}   "
              f"{row['shm_s'] * 1e3:>10.3f} {row['ratio']:>6.1f} {row['shm_ref_s'] * 1e3:>9.3f}")
    notes = ["(ms, medians) product path: a block leased, the tensor written in place (the write, "
             "in brackets,", "  not counted), its ref sent, the consumer reading a view; same "
             "pause: that round trip after a", "  busy wait as long as the write, nothing written."]
    if cost := size_cost_ms(rows):
        notes += [f"product path less the same pause, {FLAT_FROM >> 10} KiB and up: "
                  f"{cost[0]:+.3f} to {cost[1]:+.3f} ms: what grows with size", "  is the wait "
                  "for the write before the round trip (the consumer idle meanwhile, both",
                  "  processes' caches colder), not the path, on which nothing copies or scans "
                  "the tensor."]
    for line in notes:
        print(indent + line)


def main() -> None:
    print_table(shm_vs_pickle(DEFAULT_SIZES))


if __name__ == "__main__":
    main()
