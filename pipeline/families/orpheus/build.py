"""Builds the orpheus family's tiny models: random weights from fixed seeds, deterministic.

Layout under `<models_dir>/orpheus/`: talker/ (a `LlamaForCausalLM` of Orpheus's vocabulary
layout, 156940 ids with the real control and audio ids, at a tiny width; its tokenizer with
the real control ids), snac/ (SNAC with the 24 kHz framing and small widths, random weights)
and manifest.json. A real checkpoint has the same layout (release.py) and is read where it
lies: the manifest's "release" names it, and the stages load it with the same code.

The Thinker is not Orpheus's (thinker.py): by default it is the qwen25_omni family's, so
building the tiny orpheus family builds the tiny qwen25_omni family beside it. A real
checkpoint's thinker/ that is a Qwen2.5-Omni release has the qwen25_omni parts derived from it
there; one that is a chat model is served as it lies, nothing built.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, processors
from transformers import LlamaConfig, LlamaForCausalLM

from pipeline.families import load_family
from pipeline.families.kit.bpe import train_bpe
from pipeline.families.kit.build_support import (
    build_once,
    manifest_matches,
    write_json,
    write_manifest,
)
from pipeline.families.orpheus import prompt
from pipeline.families.orpheus.codes import AUDIO_IDS
from pipeline.families.orpheus.release import (
    OMNI_THINKER,
    SNAC,
    TALKER,
    THINKER,
    check_release,
    thinker_kind,
)
from pipeline.families.orpheus.snac_decoder import SNAC_24KHZ, write_snac

logger = logging.getLogger(__name__)

FAMILY = "orpheus"
RECIPE = "orpheus-tiny-1"  # bump when the build changes what it writes
SEED = 4321
VOCAB_SIZE = 156940  # Orpheus 3B's: 128256 Llama 3 ids + 10 control ids + 7 x 4096 audio ids
TEXT_VOCAB = 512  # the tiny BPE's own ids, low in the Llama range
# The tiny BPE's first ids, as this recipe has always trained it (the tiny family's ChatML
# tokens and audio placeholder; Orpheus's prompts use none of them, but they fix its text ids).
TEXT_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio|>")
CONTROL_IDS = {prompt.BEGIN_OF_TEXT: "<|begin_of_text|>", prompt.END_OF_TURN: "<|eot_id|>",
               **{128256 + k: f"<custom_token_{k}>" for k in range(AUDIO_IDS.start - 128256)}}
TINY_SNAC = {**SNAC_24KHZ, "encoder_dim": 8, "decoder_dim": 64}  # 24 kHz framing, small widths


def build_orpheus(models_dir: Path, progress: bool = True, seed: int = SEED,
                  release: Path | None = None) -> Path:
    """Build (or find already built) the orpheus family under `models_dir`; its directory.
    The qwen25_omni family, whose Thinker this family serves, is built too (tiny, or from the
    checkpoint's thinker/ when that is a Qwen2.5-Omni release). `release`: a real checkpoint
    (release.py), checked, then recorded in the manifest and read where it lies."""
    omni = load_family(OMNI_THINKER)  # by name, through the registry: a family imports no other
    if release is None:
        omni.build(models_dir, progress=progress)
    else:
        release = Path(release).resolve()
        check_release(release)
        thinker = (release / THINKER).resolve()
        if thinker_kind(thinker) == OMNI_THINKER:
            omni.build(models_dir, progress=progress, release=thinker)
        fields = {"family": FAMILY, "recipe": RECIPE, "seed": None, "release": str(release)}
        return build_once(models_dir, FAMILY, lambda target: manifest_matches(target, fields),
                          lambda staging: _write_release_manifest(staging, fields))
    return build_once(models_dir, FAMILY,
                      lambda target: manifest_matches(target, {"recipe": RECIPE, "seed": seed,
                                                               "release": None}),
                      lambda staging: _write_all(staging, seed))


def _write_release_manifest(root: Path, fields: dict[str, Any]) -> None:
    """A real checkpoint's build: the manifest alone, naming where it lies."""
    root.mkdir(parents=True)
    write_manifest(root, fields)


def _write_all(root: Path, seed: int) -> None:
    _write_talker(root / TALKER, seed)
    write_snac(root / SNAC, TINY_SNAC, seed + 1)
    write_manifest(root, {"family": FAMILY, "recipe": RECIPE, "seed": seed, "release": None})


def _write_talker(directory: Path, seed: int) -> None:
    """A random Llama of Orpheus's vocabulary, hidden 128 (head_dim 64, 2 layers), saved in
    bfloat16 like the release (its tied 156940 x 128 embedding is then 40 MB)."""
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
        rms_norm_eps=1e-5, tie_word_embeddings=True, rope_parameters={
            "rope_type": "default", "rope_theta": 500000.0},
        bos_token_id=prompt.BEGIN_OF_TEXT, eos_token_id=prompt.END_OF_SPEECH,
        pad_token_id=prompt.END_OF_SPEECH)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.bfloat16().save_pretrained(directory)
    write_json(directory / "generation_config.json", {
        "bos_token_id": prompt.BEGIN_OF_TEXT, "eos_token_id": prompt.END_OF_SPEECH,
        "pad_token_id": prompt.END_OF_SPEECH})
    _write_tokenizer(directory)


def _write_tokenizer(directory: Path) -> None:
    """The tiny BPE for text, with Llama 3's and Orpheus's control tokens at their real ids
    and <|begin_of_text|> put first, as Llama 3's tokenizer does."""
    spec = json.loads(train_bpe(TEXT_VOCAB, TEXT_SPECIAL_TOKENS).to_str())
    spec["added_tokens"] += [
        {"id": token_id, "content": content, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
        for token_id, content in CONTROL_IDS.items()]
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        special_tokens=[("<|begin_of_text|>", prompt.BEGIN_OF_TEXT)])
    tokenizer.save(str(directory / "tokenizer.json"))
    write_json(directory / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>", "model_max_length": 2048})
