"""Shared-memory block pool: how tensors cross between omnivox's processes on one host.

The pipeline (`orchestrator.Pipeline`, in the API process) creates one POSIX shared-memory
segment at start: a header every process reads and writes (per block: state, owner tag,
generation), then the data blocks. The stage workers attach by name. A writer leases a free
block and computes the tensor straight into it (`lease`; `write`/`put` copy in a tensor it
already has, `put_rows` rows over as many blocks as they need), then sends only `BlockRef`s on
the control channel; the reader maps a zero-copy view and releases the block after its last
read. A full pool is back-pressure (a wait, then `PoolExhaustedError`), never a copy or a new
allocation."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Iterator
from multiprocessing.shared_memory import SharedMemory
from typing import TYPE_CHECKING, Any

import numpy as np

# BlockRef is the pool's vocabulary: its users import it from here.
from pipeline.tensors.block_ref import BlockRef as BlockRef
from pipeline.tensors.shm_dtypes import (
    array_at,
    describe,
    is_torch_tensor,
    itemsize,
    numpy_dtype,
    tensor_at,
    torch_module,
)
from pipeline.tensors.shm_lease import BlockLease
from pipeline.tensors.shm_segment import SHM_DIR, SegmentLock, open_untracked, segment_path

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

_MAGIC = 0x316F76696E6D6F  # "omnivo1", little-endian
_VERSION = 1
_HEADER_WORDS = 8  # magic, version, block_count, block_size, stride, data_offset, 2 spare
_RECORD_WORDS = 4  # per block: state, owner, generation, taken (by a reader, `take_view`)
_FREE, _HELD = 0, 1
_ALIGN = 64  # every block starts on a cache line, which also aligns any dtype
_INLINE_COPY_MAX = 1 << 20  # async put() copies larger tensors in a thread, off the event loop
_POLL_MIN_S, _POLL_MAX_S = 0.0001, 0.005  # back-off while waiting for a free block


class PoolExhaustedError(RuntimeError):
    """No block of the pool came free within the caller's timeout."""


class StaleBlockError(RuntimeError):
    """A BlockRef whose block was released or reclaimed since the ref was made."""


class TensorTooLargeError(ValueError):
    """A tensor bigger than one block: the pool's blocks are sized for the largest tensor (rows
    of any number go in several: `BlockPool.put_rows`)."""


class BlockPool:
    """One process's handle on a shared pool of fixed-size tensor blocks.

    `owner` is the tag written on every block this handle acquires or views: when the process
    dies, `reclaim(owner)` frees what it held. Give each stage-worker slot its own tag (> 0) and
    reuse it for the restarted worker. The header is guarded by flock on the segment's file, not
    a multiprocessing.Lock: the kernel drops it when its holder dies, so a worker killed inside
    the critical section cannot wedge the pool, and any process can take it knowing only the
    name. Critical sections are a few microseconds of header reads and writes, never I/O."""

    def __init__(self, shm: SharedMemory, owner: int, fd: int, created: bool) -> None:
        if owner <= 0:
            raise ValueError(f"owner tag must be a positive int, got {owner}")
        self.name, self.owner = shm.name.lstrip("/"), owner
        buf = shm.buf
        assert buf is not None  # None only once closed; the segment was just created or attached
        self._shm, self._buf, self._created, self._lock = shm, buf, created, SegmentLock(fd)
        words = np.ndarray((_HEADER_WORDS,), np.int64, shm.buf, 0)
        if words[0] != _MAGIC or words[1] != _VERSION:
            raise ValueError(f"shared memory {self.name!r} is not an omnivox block pool")
        self.block_count, self.block_size = int(words[2]), int(words[3])
        self._stride, self._data_offset = int(words[4]), int(words[5])
        table = np.ndarray((self.block_count, _RECORD_WORDS), np.int64, shm.buf, 8 * _HEADER_WORDS)
        self._state, self._owner, self._gen = table[:, 0], table[:, 1], table[:, 2]
        self._taken = table[:, 3]

    @classmethod
    def create(cls, name: str, block_count: int, block_size: int, *, owner: int = 1) -> BlockPool:
        """Create and preallocate the pool; the creator is the one that later unlinks it."""
        path = segment_path(name)
        if block_count < 1 or block_size < 1:
            raise ValueError(f"need block_count, block_size >= 1: {block_count}, {block_size}")
        stride = -(-block_size // _ALIGN) * _ALIGN
        data_offset = -(-(_HEADER_WORDS + _RECORD_WORDS * block_count) * 8 // 4096) * 4096
        total = data_offset + stride * block_count
        stat = os.statvfs(SHM_DIR)
        if total > (free := stat.f_bavail * stat.f_frsize):
            raise OSError(f"pool {name!r} needs {total} bytes but {SHM_DIR} has {free} free "
                          f"(in a container, raise --shm-size)")
        shm = SharedMemory(name=name, create=True, size=total)
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, total)  # reserve every page now: ENOSPC here, not SIGBUS
            buf = shm.buf
            assert buf is not None  # None only once closed
            header = (_VERSION, block_count, block_size, stride, data_offset)
            buf[8:48] = np.array(header, np.int64).tobytes()
            buf[:8] = np.int64(_MAGIC).tobytes()  # last: a half-written header is no pool
            pool = cls(shm, owner, fd, created=True)
        except BaseException:
            os.close(fd)
            shm.close()
            shm.unlink()
            raise
        logger.info("created block pool %r: %d blocks x %d bytes", name, block_count, block_size)
        return pool

    @classmethod
    def attach(cls, name: str, owner: int) -> BlockPool:
        """Attach to a pool another process created; `owner` tags the blocks this one holds."""
        fd = os.open(segment_path(name), os.O_RDWR)  # FileNotFoundError: no such pool
        try:
            return cls(open_untracked(name), owner, fd, created=False)
        except BaseException:
            os.close(fd)
            raise

    @property
    def in_use(self) -> int:
        """Blocks currently held by anyone (a snapshot: no lock)."""
        return int(np.count_nonzero(self._state == _HELD))

    def held_by(self, owner: int) -> int:
        """Blocks currently held under `owner`'s tag."""
        return int(np.count_nonzero((self._state == _HELD) & (self._owner == owner)))

    def try_acquire(self) -> int | None:
        """Take a free block for this handle's owner, or None if the pool is exhausted."""
        with self._lock:
            block = int(self._state.argmin())  # the first free block, if any (_FREE < _HELD)
            if self._state[block] != _FREE:
                return None
            self._owner[block] = self.owner
            self._state[block] = _HELD  # last: a death before this leaves the block free
        return block

    async def acquire(self, timeout: float) -> int:
        """Take a free block, waiting up to `timeout` seconds without blocking the event loop."""
        pauses = self._pauses(timeout)
        while (block := self.try_acquire()) is None:
            await asyncio.sleep(next(pauses))
        return block

    def acquire_blocking(self, timeout: float) -> int:
        """Take a free block, sleeping up to `timeout` seconds: for worker threads only."""
        pauses = self._pauses(timeout)
        while (block := self.try_acquire()) is None:
            time.sleep(next(pauses))
        return block

    def ref(self, block: int, dtype: str, shape: tuple[int, ...]) -> BlockRef:
        """A ref to a block this handle acquired, to write a tensor in place through view()."""
        nbytes = itemsize(dtype) * math.prod(shape)
        self._check_fits(nbytes, dtype, shape)
        with self._lock:
            if not (0 <= block < self.block_count and self._state[block] == _HELD
                    and self._owner[block] == self.owner):
                raise StaleBlockError(f"block {block} of {self.name!r} not held by {self.owner}")
            generation = int(self._gen[block])
        return BlockRef(block, generation, dtype, tuple(map(int, shape)), nbytes)

    async def lease(self, shape: tuple[int, ...], dtype: str, timeout: float) -> BlockLease:
        """A block acquired (waiting up to `timeout`) for a `dtype` tensor of `shape` that the
        caller writes in place: the zero-copy way to produce a tensor another process reads."""
        self._check_fits(itemsize(dtype) * math.prod(shape), dtype, shape)
        return self._lease(await self.acquire(timeout), dtype, shape)

    def lease_blocking(self, shape: tuple[int, ...], dtype: str, timeout: float) -> BlockLease:
        """As `lease`, sleeping while it waits: for worker threads only."""
        self._check_fits(itemsize(dtype) * math.prod(shape), dtype, shape)
        return self._lease(self.acquire_blocking(timeout), dtype, shape)

    def write(self, array: np.ndarray | torch.Tensor, timeout: float) -> BlockRef:
        """Acquire a block (waiting up to `timeout`) and copy `array` in: for worker threads."""
        nbytes, dtype, shape = describe(array)
        self._check_fits(nbytes, dtype, shape)
        return self._fill(self.acquire_blocking(timeout), array, dtype, shape)

    async def put(self, array: np.ndarray | torch.Tensor, timeout: float) -> BlockRef:
        """Acquire a block (waiting up to `timeout`) and copy `array` in, off the loop if large."""
        nbytes, dtype, shape = describe(array)
        self._check_fits(nbytes, dtype, shape)
        block = await self.acquire(timeout)
        if nbytes <= _INLINE_COPY_MAX:
            return self._fill(block, array, dtype, shape)
        copy = asyncio.ensure_future(asyncio.to_thread(self._fill, block, array, dtype, shape))
        try:
            return await asyncio.shield(copy)
        except asyncio.CancelledError:  # the copy runs on: give its block back once it ends
            def give_back(done: asyncio.Future[BlockRef]) -> None:
                if done.exception() is None:
                    self.release(done.result())

            copy.add_done_callback(give_back)
            raise

    async def put_rows(self, array: np.ndarray | torch.Tensor, timeout: float) -> list[BlockRef]:
        """`array` cut along dim 0 into pieces that each fit a block (`row_slices`), each put
        as `put` does: how rows of any number cross, a reader joining the pieces in order.
        Waits up to `timeout` for each block; if a piece fails, those put before it are
        released, so nothing is left held."""
        nbytes, _, shape = describe(array)
        if not shape:
            raise ValueError("rows need a tensor of at least one dimension, got a scalar")
        refs: list[BlockRef] = []
        try:
            for rows in self.row_slices(shape[0], nbytes // max(shape[0], 1)):
                refs.append(await self.put(array[rows], timeout))
        except BaseException:
            for ref in refs:
                self.release(ref)
            raise
        return refs

    def row_slices(self, rows: int, row_bytes: int) -> list[slice]:
        """Consecutive runs of `rows` rows of `row_bytes` each, every run filling at most one
        block: the pieces a tensor of rows is sent in (none for no rows). A single row larger
        than a block fits no piece: TensorTooLargeError."""
        if row_bytes > self.block_size:
            raise TensorTooLargeError(
                f"a row of {row_bytes} bytes does not fit a block of {self.block_size} bytes "
                f"in pool {self.name!r}: raise the pipeline's pool.block_size setting")
        per_block = self.block_size // row_bytes if row_bytes else max(rows, 1)
        return [slice(start, start + per_block) for start in range(0, rows, per_block)]

    def view(self, ref: BlockRef) -> np.ndarray:
        """A zero-copy numpy view of the tensor in `ref`'s block; this owner now holds it."""
        numpy_dtype(ref.dtype)  # a torch-only dtype fails before the block changes hands
        self._open(ref)
        return array_at(self._buf, self._offset(ref.block), ref.dtype, ref.shape)

    def take_view(self, ref: BlockRef) -> np.ndarray:
        """A view, as `view`, of a block this reader takes over: it releases the block itself
        after its last read, and its sender's `release_unless_taken` leaves it alone."""
        numpy_dtype(ref.dtype)
        self._open(ref, taken=True)
        return array_at(self._buf, self._offset(ref.block), ref.dtype, ref.shape)

    def view_torch(self, ref: BlockRef) -> torch.Tensor:
        """A zero-copy CPU torch view of the tensor in `ref`'s block; this owner now holds it."""
        self._open(ref)
        return self._tensor(ref)

    def release(self, ref: BlockRef) -> None:
        """Give `ref`'s block back to the pool; a second release raises StaleBlockError."""
        with self._lock:
            self._check_current(ref, "release")
            self._free(ref.block)

    def release_unless_taken(self, ref: BlockRef | None) -> bool:
        """Release a block this handle wrote for a reader, unless the reader has taken it over
        (`take_view`: it releases the block itself after its last read) or it is gone already.
        The sender's way to end a job: it never frees a block under a reader still reading.
        (A reader that only `view`s a job's block leaves its release to the sender.)"""
        if ref is None or not 0 <= ref.block < self.block_count:
            return False
        with self._lock:
            if (self._state[ref.block] != _HELD or self._gen[ref.block] != ref.generation
                    or self._taken[ref.block]):
                return False
            self._free(ref.block)
        return True

    def holds(self, array: np.ndarray) -> bool:
        """Whether `array` is memory of this pool's blocks (a view into it, not a copy)."""
        segment = np.ndarray((len(self._buf),), np.uint8, self._buf)
        return bool(np.shares_memory(array, segment[self._data_offset:]))

    def reclaim(self, owner: int) -> int:
        """Free every block held under `owner` (a dead worker's tag); how many were freed.
        Their generations move on: every ref to them, even one a live reader holds, goes stale."""
        with self._lock:
            mask = (self._state == _HELD) & (self._owner == owner)
            self._free(mask)
        if count := int(np.count_nonzero(mask)):
            logger.warning("pool %r: reclaimed %d blocks of owner %d", self.name, count, owner)
        return count

    def close(self) -> None:
        """Detach this process; the segment lives on until its creator unlinks it."""
        if self._lock.fd < 0:
            return
        del self._state, self._owner, self._gen, self._taken, self._buf  # they pin the mapping
        os.close(self._lock.fd)
        self._lock.fd = -1
        try:
            self._shm.close()
        except BufferError:  # views still alive: the mapping goes when the last one does
            logger.warning("pool %r closed while views of it are alive", self.name)

    def unlink(self) -> None:
        """Destroy the segment (creator only); attached processes keep their mapping."""
        if not self._created:
            raise RuntimeError(f"pool {self.name!r} was attached here: only its creator unlinks")
        self._shm.unlink()

    def _lease(self, block: int, dtype: str, shape: tuple[int, ...]) -> BlockLease:
        return BlockLease(self, self.ref(block, dtype, shape))  # checked before the acquire

    def _fill(self, block: int, array: Any, dtype: str, shape: tuple[int, ...]) -> BlockRef:
        """Copy `array` (numpy, or torch on any device) into an acquired block; its ref."""
        ref = self.ref(block, dtype, shape)
        try:
            if is_torch_tensor(array):
                with torch_module().no_grad():  # device->host (if any) straight into the block
                    self._tensor(ref).copy_(array)
            else:  # "equiv": the source's byte order may differ
                dest = array_at(self._buf, self._offset(block), dtype, shape)
                np.copyto(dest, array, casting="equiv")
        except BaseException:
            self.release(ref)  # the block never left this handle: give it back
            raise
        return ref

    def _tensor(self, ref: BlockRef) -> torch.Tensor:
        """The block as a torch tensor, through bytes: torch has dtypes numpy lacks (bfloat16)."""
        return tensor_at(self._buf, self._offset(ref.block), ref.dtype, ref.shape, ref.nbytes)

    def _free(self, blocks: int | np.ndarray) -> None:
        """Mark blocks free (lock held); generation first, so a death midway revives no ref."""
        self._gen[blocks] += 1
        self._owner[blocks] = 0
        self._taken[blocks] = 0
        self._state[blocks] = _FREE

    def _open(self, ref: BlockRef, taken: bool = False) -> None:
        """Check that `ref` is current and make this handle's owner the block's holder."""
        self._check_fits(ref.nbytes, ref.dtype, ref.shape)
        if itemsize(ref.dtype) * math.prod(ref.shape) != ref.nbytes:
            raise ValueError(f"{ref}: nbytes does not match dtype and shape")
        with self._lock:
            self._check_current(ref, "view")
            self._owner[ref.block] = self.owner
            if taken:
                self._taken[ref.block] = 1

    def _check_current(self, ref: BlockRef, action: str) -> None:
        if not 0 <= ref.block < self.block_count:
            raise IndexError(f"no block {ref.block} in pool {self.name!r} of {self.block_count}")
        generation, state = int(self._gen[ref.block]), int(self._state[ref.block])
        if state != _HELD or generation != ref.generation:
            raise StaleBlockError(
                f"cannot {action} block {ref.block} generation {ref.generation} of pool "
                f"{self.name!r}: it was released or reclaimed (now generation {generation}, "
                f"{'held' if state == _HELD else 'free'})")

    def _check_fits(self, nbytes: int, dtype: str, shape: tuple[int, ...]) -> None:
        if nbytes > self.block_size:
            raise TensorTooLargeError(f"tensor {dtype}{list(shape)} of {nbytes} bytes does not fit "
                                      f"a block of {self.block_size} bytes in pool {self.name!r}")

    def _offset(self, block: int) -> int:
        return self._data_offset + block * self._stride

    def _pauses(self, timeout: float) -> Iterator[float]:
        """Sleeps between tries for a block, growing to _POLL_MAX_S; raises at the deadline."""
        deadline, pause = time.monotonic() + timeout, _POLL_MIN_S
        while (remaining := deadline - time.monotonic()) > 0:
            yield min(pause, remaining)
            pause = min(pause * 2, _POLL_MAX_S)
        with self._lock:
            tags, counts = np.unique(self._owner[self._state == _HELD], return_counts=True)
        owners = dict(zip(tags.tolist(), counts.tolist(), strict=True))
        raise PoolExhaustedError(
            f"pool {self.name!r}: all {self.block_count} blocks of {self.block_size} bytes in use, "
            f"none came free within {timeout:g} s (blocks per owner: {owners})")
