"""A transformers-style release directory (config.json and safetensors weights) as the families
that read one where it lies check it: the omni families' releases, real or tiny; and the
tokenizer files a model derived from one carries over."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "chat_template.json", "special_tokens_map.json", "added_tokens.json")


def release_shards(release: Path) -> list[str]:
    """The release's safetensors files (one, or those its index names)."""
    index = Path(release) / WEIGHTS_INDEX
    if not index.is_file():
        return ["model.safetensors"]
    weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
    return sorted(set(weight_map.values()))


def release_weights(release: Path) -> list[str]:
    """The weight files a release must hold: one model.safetensors, or the index and every
    shard it names."""
    shards = release_shards(release)
    return [WEIGHTS_INDEX, *shards] if (Path(release) / WEIGHTS_INDEX).is_file() else shards


def checked_release_config(directory: Path, label: str, download: str, model_type: str,
                           architectures: Iterable[str],
                           required: Iterable[str] = ()) -> dict[str, Any]:
    """The config.json of the `label` release at `directory` (`download`: where to get one),
    or a clear error: the directory or config.json absent, another model_type or none of
    `architectures`, or a file of its weights or of `required` missing."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no {label} release at {directory}: the directory is absent "
                                f"({download})")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{directory} is not a {label} release: no config.json")
    config: dict[str, Any] = json.loads(config_path.read_text())
    found = config.get("architectures") or []
    wanted = list(architectures)
    if config.get("model_type") != model_type or not set(wanted) & set(found):
        raise ValueError(
            f"{directory} is not a {label} release: config.json has model_type "
            f"{config.get('model_type')!r} and architectures {found}, expected "
            f"{model_type!r} and one of {', '.join(wanted)}")
    missing = [name for name in [*release_weights(directory), *required]
               if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{label} release at {directory} lacks {', '.join(missing)}")
    return config


def hearing_files(directory: Path) -> list[str]:
    """The files an audio-in omni release needs beside its weights: its tokenizer (tokenizer.json,
    else vocab.json), tokenizer_config.json and the audio feature extractor's
    preprocessor_config.json."""
    tokenizer = "tokenizer.json" if (Path(directory) / "tokenizer.json").is_file() else "vocab.json"
    return [tokenizer, "tokenizer_config.json", "preprocessor_config.json"]


def copy_tokenizer_files(release: Path, directory: Path) -> list[str]:
    """Copy the release's tokenizer files (those of `TOKENIZER_FILES` it has) into `directory`,
    so that a language model written there loads its tokenizer; the names copied."""
    copied = [name for name in TOKENIZER_FILES if (Path(release) / name).is_file()]
    for name in copied:
        shutil.copyfile(Path(release) / name, Path(directory) / name)
    return copied
