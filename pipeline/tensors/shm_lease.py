"""A pool block held by the process that writes a tensor into it in place (`BlockPool.lease`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pipeline.tensors.block_ref import BlockRef

if TYPE_CHECKING:
    import numpy as np
    import torch


class LeasedPool(Protocol):
    """What a lease asks of the pool its block is in (`shm.BlockPool`, which makes leases)."""

    def view(self, ref: BlockRef) -> np.ndarray: ...

    def view_torch(self, ref: BlockRef) -> torch.Tensor: ...

    def release(self, ref: BlockRef) -> None: ...


class BlockLease:
    """A block its holder writes a tensor into, in place, until it sends the ref or drops it.

    `array` (numpy) and `tensor()` (torch, any dtype) are views of the block: make them the
    output of the computation's last step (numpy's or torch's `out=`), then `send()` the ref in
    an output. As a context manager, a lease left unsent on exit (the write failed) is released.
    Its views must not be used once it is sent or released: the block is then the reader's, or
    the pool's to hand out again.
    """

    def __init__(self, pool: LeasedPool, ref: BlockRef) -> None:
        self.pool, self.ref, self.sent = pool, ref, False
        self._array: np.ndarray | None = None

    @property
    def array(self) -> np.ndarray:
        """The block as a writable numpy array of the lease's dtype and shape (no copy)."""
        self._check_held()
        if self._array is None:
            self._array = self.pool.view(self.ref)
        return self._array

    def tensor(self) -> torch.Tensor:
        """The block as a writable CPU torch tensor (no copy; also for bfloat16)."""
        self._check_held()
        return self.pool.view_torch(self.ref)

    def send(self) -> BlockRef:
        """The ref to put in an output; from now on the reader holds the block."""
        self._check_held()
        self.sent, self._array = True, None
        return self.ref

    def release(self) -> None:
        """Give the block back unsent (nothing will read it)."""
        self._check_held()
        self.sent, self._array = True, None
        self.pool.release(self.ref)

    def __enter__(self) -> BlockLease:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.sent:
            self.release()

    def _check_held(self) -> None:
        if self.sent:
            raise RuntimeError(f"block {self.ref.block} was already sent or released")
