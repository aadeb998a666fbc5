"""`BlockRef`: the name of a tensor held in one pool block, as it travels between processes.

The pool (`shm.BlockPool`) makes, maps and frees them; a lease (`shm_lease.BlockLease`) holds
one while its writer fills the block. Both take the type from here.
"""

from __future__ import annotations

import msgspec


class BlockRef(msgspec.Struct, frozen=True, tag="block"):
    """A tensor held in one pool block: the only thing that travels on the control channel."""

    block: int
    generation: int
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
