"""A release's tensors under name prefixes, read one safetensors shard at a time, and written
under new names as a model directory of their own.

The omni families derive parts from their releases: an audio tower or a vocoder loaded from the
tensors under its prefix, a language model written out as a plain transformers directory that
stock vLLM serves: the thinker's `model.*` and `lm_head` with `thinker.` dropped
(`write_renamed_shards`), or Qwen3-Omni's talker, whose names differ by more than a prefix
(its `codec_embedding` and `codec_head` are a causal LM's `embed_tokens` and `lm_head`), each
name mapped by a function (`write_mapped_shards`, which both are). A real release is tens of GB
in several shards, so everything here goes shard by shard, one shard's tensors in memory at a
time, and a written model has one shard per release shard that holds any. A weightless release
(`dummy_weights.py`: its data a hole) is renamed from its headers alone, into a weightless
model: nothing is read or written but names, shapes and dtypes (`write_headers`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pipeline.families.kit.build_support import write_json
from pipeline.families.kit.dummy_weights import SAFETENSORS_DTYPES, write_sparse_safetensors
from pipeline.families.kit.hf_release import WEIGHTS_INDEX, release_shards

TORCH_DTYPES = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}
Rename = Callable[[str], str | None]  # a release tensor's name -> its new name, None: left out


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
    """`write_mapped_shards` of the release's tensors under `prefixes`, `strip` taken off
    their names."""
    return write_mapped_shards(release, directory, stripping(prefixes, strip), dummy_weights)


def stripping(prefixes: tuple[str, ...], strip: str) -> Rename:
    """The mapping that keeps the names under `prefixes`, `strip` taken off them."""
    return lambda name: name.removeprefix(strip) if name.startswith(prefixes) else None


def write_mapped_shards(release: Path, directory: Path, rename: Rename,
                        dummy_weights: bool = False) -> dict[str, str]:
    """Write every release tensor `rename` maps to a name into `directory` under that name, as
    Hugging Face names a model's weights: model.safetensors for a one-file release, else one
    numbered shard per release shard that holds any, and their index. The weight map (new
    name -> file).

    Two tensors mapped to one name are refused (a mapping that would silently drop one).
    `dummy_weights`: the release is weightless; so is the output, written from the headers.
    """
    shards = release_shards(release)
    weight_map: dict[str, str] = {}
    for number, shard in enumerate(shards, 1):
        out = ("model.safetensors" if len(shards) == 1
               else f"model-{number:05d}-of-{len(shards):05d}.safetensors")
        with safe_open(Path(release) / shard, "pt") as source:
            renamed = _mapped_names(source.keys(), rename)
            if not renamed:
                continue
            clash = set(renamed) & set(weight_map)
            if clash:
                raise ValueError(f"tensors mapped to names already written: {sorted(clash)}")
            if dummy_weights:
                write_headers(source, renamed, Path(directory) / out)
            else:
                save_file({new: source.get_tensor(old) for new, old in renamed.items()},
                          Path(directory) / out, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(renamed, out)
    if len(shards) > 1:
        write_json(Path(directory) / WEIGHTS_INDEX, {"metadata": {}, "weight_map": weight_map})
    return weight_map


def _mapped_names(names: list[str], rename: Rename) -> dict[str, str]:
    """{new name: release name} of the `names` that `rename` keeps; a clear error for two
    mapped to one name."""
    renamed: dict[str, str] = {}
    for old in names:
        new = rename(old)
        if new is None:
            continue
        if new in renamed:
            raise ValueError(f"{renamed[new]!r} and {old!r} both map to {new!r}")
        renamed[new] = old
    return renamed


def write_headers(source: safe_open, renamed: dict[str, str], path: Path) -> None:
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
