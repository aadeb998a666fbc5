"""CUDA IPC: how CUDA tensors cross between GPU processes on one host, and the choice of transport.

A producer clones the tensor (the consumer reads memory the producer never touches again),
exports the clone's PyTorch IPC handle as a `CudaIpcRef` on the control channel and keeps the
clone alive until it is told the consumer is done. The data never leaves the GPU.
`TensorSender` picks this path when the tensor is on CUDA and the consumer runs on CUDA too, and
the shared-memory block pool otherwise (a CUDA tensor bound for a CPU consumer is copied from
the device straight into a block). torch is imported lazily, so the API process can decode
these messages without it.

The route in the stage transport (the Thinker's embeddings, read by the Talker):
1. The Thinker's `ctx.send_rows(t)` exports `t` (a `CudaIpcRef` naming the stage) when the
   tensor is on CUDA and the pipeline's `cuda_ipc` setting is on; otherwise `t`'s rows go into
   as many blocks as they need.
2. The API process cannot read an export (it never imports torch): the turn keeps the refs and
   passes them on, in order, in the Talker job's list of tensor pieces (`TalkerJob.text_embeds`).
3. The Talker's worker maps the job's exports as the job arrives (`CudaIpcImports.open`), the
   stage takes them (`ctx.take_tensors`: joined on the GPU, the join being the copy) and every
   map is dropped by the job's end at the latest.
4. When the Talker job ends in any way (finished, failed, aborted, its worker lost), the API
   process sends `ReleaseTensors` to the producing stage's worker (`CudaIpcRef.stage`), which
   drops its clones: the consumer's finished job is its acknowledgement. Exports the API
   process never passed on (the turn was cancelled, the output was never read) go back the same
   way with `delivered=False`.
Memory safety does not hang on the order of these messages: torch counts each export's maps
across processes (the count is 1 from the export until the consumer's map is dropped; torch's
Note [Sharing CUDA tensors]), and a clone the producer drops while a consumer still maps it is
kept in torch's limbo and freed by a later `ipc_collect`. So every export must have its count
given back exactly once: by the consumer's dropped map when it was delivered, and by the
producer itself (`release_ipc_counter`) when it never was. A consumer worker that dies after
its job reached it, before dropping its maps, cannot give those counts back: the allocations
stay in the producer until the producer restarts (torch's documented limit); the exporter's own
books are cleared either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from pipeline.tensors.shm import BlockPool, BlockRef, PoolExhaustedError, StaleBlockError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


class CudaIpcRef(msgspec.Struct, frozen=True, tag="cuda"):
    """A CUDA tensor exported by another process: its IPC handle, layout and transfer id."""

    transfer: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int  # in elements, within the storage
    device: int
    handle: bytes  # the CUDA allocation holding the storage
    storage_size_bytes: int
    storage_offset_bytes: int  # where the storage starts in that allocation
    ref_counter_handle: bytes  # torch's cross-process reference count of the allocation
    ref_counter_offset: int
    event_handle: bytes | None  # the event the consumer waits on before reading
    event_sync_required: bool
    stage: str = ""  # the producing stage: where the release of this transfer goes


TensorRef = BlockRef | CudaIpcRef  # what a stage sends for a tensor on the control channel


def _torch() -> Any:
    import torch  # lazy: the API process decodes these messages without importing torch

    return torch


def release_ipc_counter(ref: CudaIpcRef) -> None:
    """Give back torch's cross-process count of an export nobody will map (see the module doc)."""
    _torch().UntypedStorage._release_ipc_counter_cuda(ref.ref_counter_handle,
                                                      ref.ref_counter_offset)


def cuda_allocated_bytes() -> int:
    """Bytes this process's live CUDA tensors hold (exports in torch's limbo included, after a
    collect); 0 where CUDA was never used, without importing torch."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return 0
    torch.cuda.ipc_collect()
    return sum(int(torch.cuda.memory_allocated(d)) for d in range(torch.cuda.device_count()))


class CudaIpcExporter:
    """The producer's side of CUDA IPC: exported clones, each kept alive until its release."""

    def __init__(self, max_pending: int = 64, stage: str = "") -> None:
        self.max_pending, self.stage = max_pending, stage
        self._pending: dict[int, tuple[torch.Tensor, CudaIpcRef]] = {}
        # Random high bits: a release meant for a worker that has since been replaced never
        # names a transfer of the new one.
        self._ids = itertools.count((secrets.randbits(31) << 32) + 1)
        self._released = asyncio.Event()

    @property
    def pending(self) -> int:
        """Exports the consumer has not released yet."""
        return len(self._pending)

    def export(self, tensor: torch.Tensor) -> CudaIpcRef:
        """Clone a CUDA tensor and export the clone; PoolExhaustedError at max_pending."""
        if not tensor.is_cuda:
            raise ValueError(f"CUDA IPC exports CUDA tensors only, got one on {tensor.device}")
        if len(self._pending) >= self.max_pending:
            raise PoolExhaustedError(f"{len(self._pending)} CUDA IPC exports await release "
                                     f"(max_pending {self.max_pending}): the consumer lags")
        from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

        clone = tensor.detach().clone()  # later writes by the producer never reach the consumer
        rebuild, args = reduce_tensor(clone)
        if rebuild is not rebuild_cuda_tensor:
            raise RuntimeError(f"torch reduced a CUDA tensor with {rebuild.__name__}")
        (_, shape, stride, offset, _, dtype, device, handle, size_bytes, offset_bytes, _,
         counter_handle, counter_offset, event_handle, event_sync) = args
        ref = CudaIpcRef(next(self._ids), str(dtype).removeprefix("torch."), tuple(shape),
                         tuple(stride), offset, device, handle, size_bytes, offset_bytes,
                         counter_handle, counter_offset, event_handle, event_sync, self.stage)
        self._pending[ref.transfer] = (clone, ref)
        return ref

    async def put(self, tensor: torch.Tensor, timeout: float) -> CudaIpcRef:
        """Export, first waiting up to `timeout` for the consumer to release earlier exports."""
        deadline = time.monotonic() + timeout
        while len(self._pending) >= self.max_pending:
            self._released.clear()
            try:
                await asyncio.wait_for(self._released.wait(), deadline - time.monotonic())
            except TimeoutError:
                break  # export() raises the clear error
        return self.export(tensor)

    def release_transfers(self, transfers: Iterable[int], delivered: bool = True) -> list[int]:
        """Drop these exports' clones; the transfers not pending here, which are left alone.

        `delivered=False`: no consumer ever received them, so nobody else will give back
        torch's count of them; this does, and the memory is freed at once.
        """
        unknown, dropped = [], []
        for transfer in transfers:
            entry = self._pending.pop(transfer, None)
            if entry is None:
                unknown.append(transfer)
                continue
            if not delivered:
                release_ipc_counter(entry[1])
            dropped.append(entry)
        entry = None  # no clone outlives this call but through `dropped`
        if dropped:
            dropped.clear()  # the clones go now (or into torch's limbo while still mapped)
            self._released.set()
            _torch().cuda.ipc_collect()  # frees what consumers have unmapped since
        return unknown


def import_cuda(ref: CudaIpcRef) -> torch.Tensor:
    """The CUDA tensor another process exported, mapped without a copy (same GPU host)."""
    torch_ = _torch()
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    dtype = getattr(torch_, ref.dtype, None)
    if not isinstance(dtype, torch_.dtype):
        raise TypeError(f"unknown dtype {ref.dtype!r} in CUDA IPC transfer {ref.transfer}")
    tensor: torch.Tensor = rebuild_cuda_tensor(
        torch_.Tensor, torch_.Size(ref.shape), ref.stride, ref.storage_offset,
        torch_.storage.TypedStorage, dtype, ref.device, ref.handle,
        ref.storage_size_bytes, ref.storage_offset_bytes, False, ref.ref_counter_handle,
        ref.ref_counter_offset, ref.event_handle, ref.event_sync_required)
    return tensor


class CudaIpcImports:
    """The consumer's side: exports mapped as their job arrives, held until taken or its end.

    Mapping every export of a job at once, in the worker's event loop, gives each one exactly
    one map whatever the stage does: taken, never read, or the job aborted while its stage
    works. The map's drop (the last reference, wherever it is) gives torch's count back.
    A stage that reads CUDA tensors has torch loaded (and CUDA initialised) by its start():
    a map then costs microseconds, while loading torch here would stall the event loop for
    seconds, so a stage without torch refuses such jobs instead.
    """

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], torch.Tensor] = {}

    @property
    def held(self) -> int:
        """Maps neither taken nor dropped yet (0 between jobs)."""
        return len(self._held)

    def open(self, refs: Iterable[TensorRef]) -> None:
        """Map these refs' CUDA exports (blocks need nothing); on failure, none stays mapped."""
        exports = [ref for ref in refs if isinstance(ref, CudaIpcRef)]
        if exports and "torch" not in sys.modules:
            raise RuntimeError(f"{len(exports)} CUDA IPC tensors came to a stage that does not use "
                               f"torch, which cannot read them (turn the pipeline's cuda_ipc off "
                               f"for a consumer without CUDA)")
        opened: list[tuple[str, int]] = []
        for index, ref in enumerate(exports):
            try:
                self._held[ref.stage, ref.transfer] = import_cuda(ref)
            except Exception:
                for key in opened:
                    del self._held[key]  # their maps give their counts back
                # torch sets up a map's count return only once the map exists: the failed
                # one and the rest will never give theirs back, so it is done here.
                self.refuse(exports[index:])
                raise
            opened.append((ref.stage, ref.transfer))

    def take(self, ref: CudaIpcRef) -> torch.Tensor:
        """The mapped tensor of `ref`, no longer held here (the caller's reference is the map)."""
        tensor = self._held.pop((ref.stage, ref.transfer), None)
        if tensor is None:
            raise StaleBlockError(f"CUDA IPC transfer {ref.transfer} of {ref.stage!r} is not "
                                  f"mapped here: already taken, or its job has ended")
        return tensor

    def close(self, refs: Iterable[TensorRef]) -> None:
        """Drop the maps of these refs not taken (the job ended)."""
        for ref in refs:
            if isinstance(ref, CudaIpcRef):
                self._held.pop((ref.stage, ref.transfer), None)

    @staticmethod
    def refuse(refs: Iterable[TensorRef]) -> None:
        """Give back torch's count of exports this consumer will never map (a refused job)."""
        exports = [ref for ref in refs if isinstance(ref, CudaIpcRef)]
        if exports and "torch" not in sys.modules:  # a stage without torch never maps any
            logger.error("%d CUDA IPC exports refused by a stage without torch stay allocated "
                         "in their producer", len(exports))
            return
        for ref in exports:
            with contextlib.suppress(Exception):  # best effort: its producer may be gone
                release_ipc_counter(ref)


class TensorSender:
    """A producer's end of one tensor link: CUDA IPC when the tensor and the consumer are both
    on CUDA, the shared-memory pool otherwise (numpy arrays and CPU tensors always)."""

    def __init__(self, pool: BlockPool, peer_on_cuda: bool, max_pending: int = 64,
                 stage: str = "") -> None:
        self.pool, self.peer_on_cuda = pool, peer_on_cuda
        self.exporter = CudaIpcExporter(max_pending, stage)

    def uses_cuda_ipc(self, tensor: Any) -> bool:
        return self.peer_on_cuda and getattr(tensor, "is_cuda", False)

    async def send(self, tensor: Any, timeout: float) -> TensorRef:
        """The ref to send for `tensor`, waiting up to `timeout` for room (back-pressure)."""
        if self.uses_cuda_ipc(tensor):
            return await self.exporter.put(tensor, timeout)
        return await self.pool.put(tensor, timeout)

    def release(self, transfers: Iterable[int], delivered: bool = True) -> list[int]:
        """Drop the exports of these transfers (see `CudaIpcExporter.release_transfers`)."""
        return self.exporter.release_transfers(transfers, delivered)

