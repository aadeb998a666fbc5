"""How a tensor is named in a `BlockRef` (dtype name, shape, bytes) and seen over a block's bytes.

numpy for numeric dtypes, torch for those numpy lacks (bfloat16); torch is imported only by the
processes that hand the pool torch tensors or ask for torch views.
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

NUMPY_KINDS = "biufc"  # bool, signed, unsigned, float, complex


def torch_module() -> Any:
    import torch  # lazy: processes that never touch tensors never pay for the import
    return torch


def is_torch_tensor(obj: object) -> bool:
    torch = sys.modules.get("torch")  # a torch tensor cannot exist unless torch is imported
    return torch is not None and isinstance(obj, torch.Tensor)


def describe(array: np.ndarray | np.generic | torch.Tensor) -> tuple[int, str, tuple[int, ...]]:
    """The byte size, dtype name and shape a BlockRef records for `array`."""
    if is_torch_tensor(array):
        return array.nbytes, str(array.dtype).removeprefix("torch."), tuple(array.shape)
    if not isinstance(array, np.ndarray | np.generic):
        raise TypeError(f"expected a numpy array or a torch tensor, got {type(array).__name__}")
    if array.dtype.kind not in NUMPY_KINDS:
        raise TypeError(f"dtype {array.dtype} cannot travel in a block (numeric dtypes only)")
    return array.nbytes, dtype_name(array.dtype), tuple(array.shape)


@functools.lru_cache(maxsize=64)
def dtype_name(dtype: np.dtype) -> str:
    return dtype.name  # computed in Python by numpy, slowly: cached


@functools.lru_cache(maxsize=64)
def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype a BlockRef's dtype name stands for (numeric, canonical names only)."""
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise TypeError(f"dtype {name!r} has no numpy equivalent; use view_torch") from None
    if dtype.kind not in NUMPY_KINDS or dtype.name != name:
        raise TypeError(f"dtype {name!r} cannot travel in a block (numeric dtypes only)")
    return dtype


def torch_dtype(name: str) -> torch.dtype:
    import torch  # lazy, as torch_module(); typed here

    if not isinstance(dtype := getattr(torch, name, None), torch.dtype):
        raise TypeError(f"unknown dtype {name!r}")
    return dtype


@functools.lru_cache(maxsize=64)
def itemsize(dtype: str) -> int:
    try:
        return numpy_dtype(dtype).itemsize
    except TypeError:  # torch-only dtypes (bfloat16, float8): reading them needs torch anyway
        return torch_dtype(dtype).itemsize


def array_at(buf: memoryview, offset: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """A numpy array over `buf` at `offset`: no copy, writable, alive as long as `buf` is."""
    return np.ndarray(shape, numpy_dtype(dtype), buf, offset)


def tensor_at(buf: memoryview, offset: int, dtype: str, shape: tuple[int, ...],
              nbytes: int) -> torch.Tensor:
    """A CPU torch tensor over `buf` at `offset`, through bytes: torch has dtypes numpy lacks."""
    raw = np.ndarray((nbytes,), np.uint8, buf, offset)
    tensor: torch.Tensor = torch_module().from_numpy(raw).view(torch_dtype(dtype)).view(shape)
    return tensor
