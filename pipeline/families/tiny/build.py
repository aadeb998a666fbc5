"""Builds the tiny family's model directory: random weights from fixed seeds, deterministic.

Layout under `<models_dir>/tiny/`: thinker/ (Qwen2 LLM, BPE tokenizer, audio encoder),
talker/ (Qwen2 over speech codes, projection and speakers), voicebox/ (waveform decoder) and
manifest.json (sha256 of every file). A build whose manifest still matches is skipped; a new
build is written to a temporary directory and renamed into place, under a file lock, so a
crashed or concurrent build never leaves a half-written family behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from pipeline.families.tiny import talker_prompt
from pipeline.families.tiny.audio_encoder import write_audio_encoder
from pipeline.families.tiny.qwen2 import Qwen2Shape, write_qwen2
from pipeline.families.tiny.tokenizer import IM_END, PAD, save_tokenizer, train_tokenizer
from pipeline.families.tiny.voice_decoder import VoiceDecoderConfig, write_voice_decoder

logger = logging.getLogger(__name__)

FAMILY = "tiny"
RECIPE = "tiny-2"  # bump when the build changes what it writes: old builds are then rebuilt
SEED = 1234
THINKER_VOCAB = 512
THINKER_HIDDEN = 128  # head_dim 64: one of the sizes CPU attention accepts
TALKER_HIDDEN = 128
MANIFEST = "manifest.json"


def build_tiny(models_dir: Path, progress: bool = True, seed: int = SEED) -> Path:
    """Build (or find already built) the tiny family under `models_dir`; its directory."""
    models_dir = Path(models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    target = models_dir / FAMILY
    with _locked(models_dir / f".{FAMILY}.lock"):
        if _is_built(target, seed):
            logger.info("tiny family already built at %s (manifest matches)", target)
            return target
        staging = models_dir / f".{FAMILY}.build-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            _write_all(staging, seed, progress)
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("built tiny family at %s", target)
    return target


def manifest_checksum(family_dir: Path) -> str:
    """The checksum recorded in a built family's manifest."""
    return json.loads((family_dir / MANIFEST).read_text())["checksum"]


def _write_all(root: Path, seed: int, progress: bool) -> None:
    steps: list[tuple[str, Callable[[], None]]] = [
        ("thinker tokenizer", lambda: _write_tokenizer(root / "thinker")),
        ("thinker LLM", lambda: _write_thinker(root / "thinker", seed)),
        ("audio encoder", lambda: write_audio_encoder(
            root / "thinker" / "audio_encoder", THINKER_HIDDEN, seed + 1)),
        ("talker LLM", lambda: _write_talker(root / "talker", seed + 2)),
        ("talker projection and speakers", lambda: talker_prompt.write_talker_extra(
            root / "talker", THINKER_HIDDEN, TALKER_HIDDEN, seed + 3)),
        ("voicebox", lambda: write_voice_decoder(
            root / "voicebox", VoiceDecoderConfig(n_codes=talker_prompt.N_CODES), seed + 4)),
        ("manifest", lambda: _write_manifest(root, seed)),
    ]
    for name, step in tqdm(steps, desc="building tiny family", unit="step", disable=not progress):
        logger.debug("tiny build: %s", name)
        step()


def _write_tokenizer(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_tokenizer(train_tokenizer(THINKER_VOCAB), directory, model_max_length=2048)


def _write_thinker(directory: Path, seed: int) -> None:
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    write_qwen2(directory, Qwen2Shape(vocab_size=THINKER_VOCAB, hidden_size=THINKER_HIDDEN),
                seed, bos_id=None, eos_id=ids[IM_END])
    _write_json(directory / "generation_config.json",
                {"eos_token_id": [ids[IM_END], ids[PAD]], "pad_token_id": ids[PAD]})


def _write_talker(directory: Path, seed: int) -> None:
    shape = Qwen2Shape(vocab_size=talker_prompt.VOCAB_SIZE, hidden_size=TALKER_HIDDEN)
    write_qwen2(directory, shape, seed, bos_id=talker_prompt.BOS, eos_id=talker_prompt.EOS)
    _write_json(directory / "generation_config.json",
                {"bos_token_id": talker_prompt.BOS, "eos_token_id": talker_prompt.EOS,
                 "pad_token_id": talker_prompt.PAD})


def _write_manifest(root: Path, seed: int) -> None:
    files = _digests(root)
    _write_json(root / MANIFEST, {"family": FAMILY, "recipe": RECIPE, "seed": seed,
                                  "files": files, "checksum": _checksum(files)})


def _is_built(target: Path, seed: int) -> bool:
    try:
        manifest = json.loads((target / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("recipe") != RECIPE or manifest.get("seed") != seed:
        return False
    files = _digests(target)
    return files == manifest.get("files") and _checksum(files) == manifest.get("checksum")


def _digests(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }


def _checksum(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def _write_json(path: Path, obj: dict) -> None:
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
