"""CUDA IPC: how CUDA tensors cross between GPU processes on one host, and the choice of transport.

A producer clones the tensor (the consumer reads memory the producer never touches again),
exports the clone's PyTorch IPC handle as a `CudaIpcRef` on the control channel and keeps the
clone alive until the consumer answers with a `CudaIpcRelease`. The data never leaves the GPU.
`TensorSender` picks this path when the tensor is on CUDA and the consumer runs on CUDA too, and
the shared-memory block pool otherwise (a CUDA tensor bound for a CPU consumer is copied from
the device straight into a block). torch is imported lazily, so the API process can decode
these messages without it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec

from pipeline.shm import BlockPool, BlockRef, PoolExhaustedError, StaleBlockError

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


class CudaIpcRelease(msgspec.Struct, frozen=True, tag="cuda_release"):
    """The consumer's answer: it dropped the tensor of `transfer`; the producer may free it."""

    transfer: int


TensorRef = BlockRef | CudaIpcRef  # what a stage sends for a tensor on the control channel


def _torch() -> Any:
    import torch  # lazy: the API process decodes these messages without importing torch

    return torch


class CudaIpcExporter:
    """The producer's side of CUDA IPC: exported clones, each kept alive until its release."""

    def __init__(self, max_pending: int = 64) -> None:
        self.max_pending = max_pending
        self._pending: dict[int, torch.Tensor] = {}
        self._ids = itertools.count(1)
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
                         counter_handle, counter_offset, event_handle, event_sync)
        self._pending[ref.transfer] = clone
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

    def release(self, message: CudaIpcRelease) -> None:
        """Drop the clone the consumer has released; torch frees it once no process maps it."""
        if self._pending.pop(message.transfer, None) is None:
            raise StaleBlockError(f"CUDA IPC transfer {message.transfer} is unknown or already "
                                  f"released")
        self._released.set()
        _torch().cuda.ipc_collect()

    def forget_all(self) -> int:
        """Drop every pending clone (the consumer died); how many were dropped."""
        count = len(self._pending)
        self._pending.clear()
        self._released.set()
        if count:
            logger.warning("dropped %d CUDA IPC exports of a consumer that went away", count)
        return count


def import_cuda(ref: CudaIpcRef) -> torch.Tensor:
    """The CUDA tensor another process exported, mapped without a copy (same GPU host)."""
    torch = _torch()
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    dtype = getattr(torch, ref.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"unknown dtype {ref.dtype!r} in CUDA IPC transfer {ref.transfer}")
    return rebuild_cuda_tensor(
        torch.Tensor, torch.Size(ref.shape), ref.stride, ref.storage_offset,
        torch.storage.TypedStorage, dtype, ref.device, ref.handle,
        ref.storage_size_bytes, ref.storage_offset_bytes, False, ref.ref_counter_handle,
        ref.ref_counter_offset, ref.event_handle, ref.event_sync_required)


class TensorSender:
    """A producer's end of one tensor link: CUDA IPC when the tensor and the consumer are both
    on CUDA, the shared-memory pool otherwise."""

    def __init__(self, pool: BlockPool, peer_on_cuda: bool, max_pending: int = 64) -> None:
        self.pool, self.peer_on_cuda = pool, peer_on_cuda
        self.exporter = CudaIpcExporter(max_pending)

    def uses_cuda_ipc(self, tensor: torch.Tensor) -> bool:
        return self.peer_on_cuda and tensor.is_cuda

    async def send(self, tensor: torch.Tensor, timeout: float) -> TensorRef:
        """The ref to send for `tensor`, waiting up to `timeout` for room (back-pressure)."""
        if self.uses_cuda_ipc(tensor):
            return await self.exporter.put(tensor, timeout)
        return await self.pool.put(tensor, timeout)

    def on_release(self, message: CudaIpcRelease) -> None:
        """The consumer released a CUDA IPC transfer (block releases need no message)."""
        self.exporter.release(message)


def open_tensor(pool: BlockPool, ref: TensorRef) -> torch.Tensor:
    """The consumer's zero-copy tensor for `ref`: a CPU view of a block, or the CUDA import."""
    if isinstance(ref, CudaIpcRef):
        return import_cuda(ref)
    return pool.view_torch(ref)


def close_tensor(pool: BlockPool, ref: TensorRef) -> CudaIpcRelease | None:
    """Give back what `ref` holds, once the consumer dropped its tensor: a block goes back to
    the pool at once; for CUDA IPC, the release message to send to the producer."""
    if isinstance(ref, CudaIpcRef):
        return CudaIpcRelease(ref.transfer)
    pool.release(ref)
    return None
