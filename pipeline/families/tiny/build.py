"""Builds the tiny family's model directory: random weights from fixed seeds, deterministic.

Layout under `<models_dir>/tiny/`: thinker/ (Qwen2 LLM, BPE tokenizer, audio encoder),
talker/ (Qwen2 over speech codes, projection and speakers), voicebox/ (waveform decoder) and
manifest.json (sha256 of every file). A build whose manifest still matches is skipped;
otherwise the family is rebuilt whole, in a staging directory under a file lock
(`pipeline.families.kit.build_support`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from pipeline.families.kit.build_support import (
    build_once,
    manifest_matches,
    write_json,
    write_manifest,
)
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


def build_tiny(models_dir: Path, progress: bool = True, seed: int = SEED) -> Path:
    """Build (or find already built) the tiny family under `models_dir`; its directory."""
    return build_once(models_dir, FAMILY,
                      lambda target: manifest_matches(target, {"recipe": RECIPE, "seed": seed}),
                      lambda staging: _write_all(staging, seed, progress))


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
        ("manifest", lambda: write_manifest(
            root, {"family": FAMILY, "recipe": RECIPE, "seed": seed})),
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
    write_json(directory / "generation_config.json",
               {"eos_token_id": [ids[IM_END], ids[PAD]], "pad_token_id": ids[PAD]})


def _write_talker(directory: Path, seed: int) -> None:
    shape = Qwen2Shape(vocab_size=talker_prompt.VOCAB_SIZE, hidden_size=TALKER_HIDDEN)
    write_qwen2(directory, shape, seed, bos_id=talker_prompt.BOS, eos_id=talker_prompt.EOS)
    write_json(directory / "generation_config.json",
               {"bos_token_id": talker_prompt.BOS, "eos_token_id": talker_prompt.EOS,
                "pad_token_id": talker_prompt.PAD})
