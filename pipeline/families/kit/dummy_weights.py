"""Weightless checkpoints: a model's real tensor names and shapes in a safetensors file whose
data is a hole in a sparse file, and parameter counts taken on torch's meta device.

The GPU check runs real-size architectures with no weights: vLLM engines start with
`load_format="dummy"` and read none of it, and torch-side modules that load the file read
zeros (a hole costs no disk and no write time, and zero weights cost the same compute as
trained ones). Nothing here ever allocates a real-size tensor.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

SHARD_BYTES = 4 * 2**30  # as the releases shard: one mmap of a whole 7B file can be refused
INDEX = "model.safetensors.index.json"
SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                      torch.int64: "I64", torch.int32: "I32", torch.bool: "BOOL"}


def meta_tensors(factory: Callable[[], torch.nn.Module]) -> dict[str, torch.Tensor]:
    """The state dict of the module `factory` builds, built on the meta device (no memory)."""
    with torch.device("meta"):
        return dict(factory().state_dict())


def parameter_count(tensors: Mapping[str, torch.Tensor], prefix: str = "") -> int:
    """Elements of the floating-point tensors whose names start with `prefix`."""
    return sum(t.numel() for name, t in tensors.items()
               if name.startswith(prefix) and t.is_floating_point())


def part_sizes(tensors: Mapping[str, torch.Tensor],
               stage_parts: Mapping[str, Mapping[str, Sequence[str]]],
               states_bytes: int = 2) -> dict[str, Any]:
    """Per stage and part (each a list of tensor-name prefixes): parameters and weight memory
    in bytes, bfloat16 (2 bytes a parameter) but a part named for the Thinker's hidden-state
    copy ("states" in its name), at `states_bytes` a parameter."""
    stages: dict[str, Any] = {}
    for stage, parts in stage_parts.items():
        rows = {}
        for part, prefixes in parts.items():
            count = sum(parameter_count(tensors, prefix) for prefix in prefixes)
            width = states_bytes if "states" in part else 2
            rows[part] = {"parameters": count, "weight_bytes": count * width}
        stages[stage] = rows
    return stages


def write_sparse_checkpoint(directory: Path, tensors: Mapping[str, torch.Tensor],
                            dtype: torch.dtype = torch.bfloat16) -> int:
    """`tensors` as sparse safetensors shards of at most about `SHARD_BYTES` in `directory`,
    named and indexed as Hugging Face names them (one file: model.safetensors, no index);
    the data's size in bytes."""
    groups: list[dict[str, torch.Tensor]] = [{}]
    filled = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * (dtype.itemsize if tensor.is_floating_point() else
                                 tensor.element_size())
        if groups[-1] and filled + size > SHARD_BYTES:
            groups.append({})
            filled = 0
        groups[-1][name] = tensor
        filled += size
    if len(groups) == 1:
        return write_sparse_safetensors(Path(directory) / "model.safetensors", groups[0], dtype)
    total, weight_map = 0, dict[str, str]()
    for number, group in enumerate(groups, 1):
        shard = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        total += write_sparse_safetensors(Path(directory) / shard, group, dtype)
        weight_map |= dict.fromkeys(group, shard)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (Path(directory) / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    return total


def write_sparse_safetensors(path: Path, tensors: Mapping[str, torch.Tensor],
                             dtype: torch.dtype = torch.bfloat16) -> int:
    """Write a safetensors file of `tensors`' names and shapes (floating ones as `dtype`, others
    as they are) whose data is all zeros, as a sparse file; the data's size in bytes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in tensors.items():
        kind = dtype if tensor.is_floating_point() else tensor.dtype
        size = tensor.numel() * kind.itemsize
        header[name] = {"dtype": SAFETENSORS_DTYPES[kind], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format aligns the data to 8 bytes
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(encoded)) + encoded)
        file.truncate(8 + len(encoded) + offset)  # the data: a hole, read back as zeros
    return offset
