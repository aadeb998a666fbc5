"""GPU-host check and benchmark of the CUDA IPC path against the shared-memory pool.

A producer sends one CUDA tensor to a spawned consumer, which reads it on the GPU (its sum) and
answers, both through the stage context as the Thinker's and the Talker's workers do; timed in
the producer from `StageContext.send_tensor` to the answer, after warm-up rounds:
- `cuda_ipc`: the consumer is on CUDA, so the tensor travels as a PyTorch IPC handle (a clone
  stays on the device, mapped by the consumer as its job arrives, read with `read_tensors`;
  the producer frees it on the release, as its worker does on `ReleaseTensors`);
- `shm_via_host`: the consumer is on the CPU side, so the tensor is copied from the device into
  a pool block, and the consumer reads a view of it (`read_tensors`) and copies it back up.
Run `python -m agent.bench.cuda_ipc` on a GPU host; it says so and exits 0 without CUDA.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import statistics
import sys
import time
import uuid
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from pipeline.stage import StageContext, TalkerJob
from pipeline.tensors.cuda_ipc import CudaIpcRef, TensorRef
from pipeline.tensors.shm import BlockPool

SIZES = [1 << 20, 16 << 20, 64 << 20]
REPEATS = 20
_WARMUP = 2
_STOP = b"stop"


def _consumer(pool_name: str, conn: Connection) -> None:
    """Reads each tensor on the GPU as a Talker reads its job's pieces; answers with its sum
    and the CUDA IPC transfers to release (none for a block: reading it gave it back)."""
    import torch  # before any job: a stage without torch refuses CUDA IPC pieces

    ctx = StageContext(BlockPool.attach(pool_name, owner=3), {}, "unused", "talker")
    while (data := conn.recv_bytes()) != _STOP:
        job = TalkerJob("bench", "", [msgspec.msgpack.decode(data, type=TensorRef)])
        ctx.receive_job(job)
        with ctx.read_tensors(job.text_embeds) as tensor:
            total = float(torch.as_tensor(tensor).cuda().sum().item())
        del tensor  # dropped before the release: the producer may free it then
        ctx.end_job(job)
        exports = [ref.transfer for ref in job.text_embeds if isinstance(ref, CudaIpcRef)]
        conn.send_bytes(msgspec.msgpack.encode([total, exports]))


async def _round_trips(ctx: StageContext, conn: Connection, tensor: Any) -> list[float]:
    expected = float(tensor.sum().item())
    times = []
    for i in range(REPEATS + _WARMUP):
        start = time.perf_counter()
        conn.send_bytes(msgspec.msgpack.encode(await ctx.send_tensor(tensor)))
        total, exports = msgspec.msgpack.decode(conn.recv_bytes())
        if ctx.sender.release(exports):  # what the worker does on ReleaseTensors
            raise AssertionError(f"CUDA IPC transfers {exports} were not pending")
        if i >= _WARMUP:
            times.append(time.perf_counter() - start)
        if abs(total - expected) > 1e-3 * max(1.0, abs(expected)):
            raise AssertionError(f"consumer read {total}, expected {expected}")
    if ctx.sender.exporter.pending:
        raise AssertionError(f"{ctx.sender.exporter.pending} CUDA IPC exports never released")
    return times


async def run() -> dict[str, Any]:
    import torch

    pool_name = f"ovxipc{uuid.uuid4().hex[:8]}"
    pool = BlockPool.create(pool_name, 4, max(SIZES))
    ours, theirs = mp.get_context("spawn").Pipe()
    consumer = mp.get_context("spawn").Process(target=_consumer, args=(pool_name, theirs))
    consumer.start()
    rows = []
    try:
        for size in SIZES:
            tensor = torch.randn(size // 4, device="cuda")
            row: dict[str, Any] = {"bytes": size}
            for mode, peer_on_cuda in (("cuda_ipc", True), ("shm_via_host", False)):
                ctx = StageContext(pool, {}, "unused", "thinker", cuda_ipc=peer_on_cuda)
                times = await _round_trips(ctx, ours, tensor)
                row[f"{mode}_ms"] = round(statistics.median(times) * 1000, 3)
            row["ratio"] = round(row["shm_via_host_ms"] / row["cuda_ipc_ms"], 1)
            rows.append(row)
    finally:
        ours.send_bytes(_STOP)
        consumer.join(30)
        pool.close()
        pool.unlink()
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}


def main() -> int:
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        print("bench cuda_ipc: no CUDA device here; this benchmark runs on GPU hosts only")
        return 0
    result = asyncio.run(run())
    for row in result["rows"]:
        print(f"{row['bytes'] >> 20:>4} MiB  cuda_ipc {row['cuda_ipc_ms']:8.3f} ms   "
              f"shm_via_host {row['shm_via_host_ms']:8.3f} ms   ratio {row['ratio']:5.1f}x")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
