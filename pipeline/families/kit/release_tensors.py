"""A release's tensors under name prefixes, read one safetensors shard at a time, and written
renamed as a model directory of their own.

The omni families derive parts from their releases: an audio tower or a vocoder loaded from the
tensors under its prefix, a language model written out as a plain transformers directory that
stock vLLM serves (the thinker's `model.*` and `lm_head` with `thinker.` dropped). A real
release is tens of GB in several shards, so everything here goes shard by shard, one shard's
tensors in memory at a time, and a written model has one shard per release shard that holds
any. A weightless release (`dummy_weights.py`: its data a hole) is renamed from its headers
alone, into a weightless model: nothing is read or written but names, shapes and dtypes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pipeline.families.kit.build_support import write_json
from pipeline.families.kit.dummy_weights import SAFETENSORS_DTYPES, write_sparse_safetensors
from pipeline.families.kit.hf_release import WEIGHTS_INDEX, release_shards

TORCH_DTYPES = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}


def release_tensor_names(release: Path) -> set[str]:
    """Every tensor name the release's weights hold (from the index, or the one file)."""
    index = Path(release) / WEIGHTS_INDEX
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    with safe_open(Path(release) / "model.safetensors", "pt") as source:
        return set(source.keys())


def shard_tensors(release: Path, prefixes: tuple[str, ...],
                  strip: str) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
    """Per release shard: its name and its tensors under `prefixes`, `strip` taken off their
    names (one shard in memory at a time)."""
    for shard in release_shards(release):
        with safe_open(Path(release) / shard, "pt") as source:
            names = [key for key in source.keys() if key.startswith(prefixes)]  # noqa: SIM118
            yield shard, {key.removeprefix(strip): source.get_tensor(key) for key in names}


def release_tensors(release: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The release's tensors under `prefix`, the prefix taken off their names."""
    tensors: dict[str, torch.Tensor] = {}
    for _, part in shard_tensors(release, (prefix,), prefix):
        tensors |= part
    return tensors


def write_renamed_shards(release: Path, directory: Path, prefixes: tuple[str, ...], strip: str,
                         dummy_weights: bool = False) -> dict[str, str]:
    """Write the release's tensors under `prefixes`, `strip` taken off their names, into
    `directory` as Hugging Face names a model's weights: model.safetensors for a one-file
    release, else one numbered shard per release shard holding any, and their index. The
    weight map (tensor name -> file).

    `dummy_weights`: the release is weightless; so is the output, written from the headers.
    """
    shards = release_shards(release)
    weight_map: dict[str, str] = {}
    for number, shard in enumerate(shards, 1):
        out = ("model.safetensors" if len(shards) == 1
               else f"model-{number:05d}-of-{len(shards):05d}.safetensors")
        with safe_open(Path(release) / shard, "pt") as source:
            renamed = {key.removeprefix(strip): key for key in source.keys()  # noqa: SIM118
                       if key.startswith(prefixes)}
            if not renamed:
                continue
            if dummy_weights:
                _write_headers(source, renamed, Path(directory) / out)
            else:
                save_file({new: source.get_tensor(old) for new, old in renamed.items()},
                          Path(directory) / out, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(renamed, out)
    if len(shards) > 1:
        write_json(Path(directory) / WEIGHTS_INDEX, {"metadata": {}, "weight_map": weight_map})
    return weight_map


def _write_headers(source: safe_open, renamed: dict[str, str], path: Path) -> None:
    """The `renamed` tensors (new name -> name in `source`) as a sparse safetensors file of
    their shapes and dtypes (`dummy_weights.write_sparse_safetensors`: it writes every floating
    tensor at one dtype, so a shard of mixed floating dtypes is refused)."""
    metas = {}
    for new, old in renamed.items():
        header = source.get_slice(old)
        metas[new] = torch.empty(header.get_shape(), dtype=TORCH_DTYPES[header.get_dtype()],
                                 device="meta")
    floating = {t.dtype for t in metas.values() if t.is_floating_point()}
    if len(floating) > 1:
        raise ValueError(f"{path.name}: the weightless release mixes floating dtypes {floating}")
    write_sparse_safetensors(path, metas, floating.pop() if floating else torch.bfloat16)
