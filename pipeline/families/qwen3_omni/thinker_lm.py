"""The thinker's language model as a plain `Qwen3MoeForCausalLM` directory, for stock vLLM.

Qwen3-Omni's thinker over prompt embeddings is a Qwen3-MoE decoder (RMS norms on each head's
queries and keys, top-k routed experts without a shared expert) under interleaved M-RoPE. For
audio and text prompts the reference gives every row the same position in all three M-RoPE
components (transformers' `get_rope_index`: only image and video grids differ), and interleaving
the sections of three equal angles leaves each frequency its 1-D angle: M-RoPE then IS 1-D RoPE
at the same theta, and the stock Qwen3-MoE decoder computes what the thinker computes.
tests/test_qwen3_omni_thinker.py measures it: the same logits over the same embeddings as
transformers' thinker, and vLLM's greedy tokens from audio-tower and text embeddings equal the
reference's for 40 steps. (Vision prompts would need M-RoPE and deepstack; they are not served.)

Written: config.json (`lm_config`: every field vLLM's and transformers' Qwen3-MoE read, from the
thinker's text config, as `qwen3_moe_lm` writes both LMs'), the thinker's `model.*` and
`lm_head` tensors with `thinker.` dropped, one output shard per release shard
(`release_tensors.write_renamed_shards`), experts one by one as the release names them,
generation_config.json with the stop ids, and the release's tokenizer files where it has
them (the tiny release's is `tiny_tokenizer`'s). The same code converts tiny and real
releases.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import Qwen3MoeConfig, Qwen3OmniMoeConfig

from pipeline.families.kit.build_support import write_json
from pipeline.families.kit.hf_release import copy_tokenizer_files
from pipeline.families.kit.release_tensors import write_renamed_shards
from pipeline.families.qwen3_omni import qwen3_moe_lm
from pipeline.families.qwen3_omni.qwen3_moe_lm import GENERATION_CONFIG, check_plain_decoder

PREFIXES = ("thinker.model.", "thinker.lm_head.")
STRIP = "thinker."


def write_thinker_lm(release: Path, directory: Path, dummy_weights: bool = False) -> None:
    """Write the thinker's LM from the release directory `release` into `directory`.

    `dummy_weights`: the release is weightless (`dummy_weights.py`); so is the LM, renamed from
    the release's headers (holes stay holes) without reading or writing any data.
    """
    release, directory = Path(release), Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lm_config(release).save_pretrained(directory)
    write_renamed_shards(release, directory, PREFIXES, STRIP, dummy_weights)
    copy_tokenizer_files(release, directory)
    stops = stop_ids(release)
    write_json(directory / GENERATION_CONFIG,
               {"eos_token_id": stops, **_pad_id(release)})


def text_config(release: Path) -> Any:
    """The thinker's text config (a `Qwen3OmniMoeTextConfig`) from the release's config.json."""
    thinker: Any = Qwen3OmniMoeConfig.from_pretrained(release).thinker_config  # a sub-config
    return thinker.text_config


def lm_config(release: Path) -> Qwen3MoeConfig:
    """The Qwen3-MoE config of the release's thinker text model (`qwen3_moe_lm.lm_config`)
    with its sparse-layer layout, tied head and token ids; a clear error for a thinker that a
    Qwen3-MoE decoder cannot be (`_check_convertible`)."""
    text = text_config(release)
    _check_convertible(text)
    return qwen3_moe_lm.lm_config(
        release, text,
        decoder_sparse_step=text.decoder_sparse_step, mlp_only_layers=list(text.mlp_only_layers),
        tie_word_embeddings=text.tie_word_embeddings,
        bos_token_id=text.bos_token_id, eos_token_id=text.eos_token_id,
        pad_token_id=text.pad_token_id)


def _check_convertible(text: Any) -> None:
    """Refuse a thinker text model that a plain Qwen3-MoE decoder would compute differently:
    no q/k norms, a shared expert (transformers' Qwen3MoeForCausalLM has none), or what
    `qwen3_moe_lm.check_plain_decoder` refuses in either LM."""
    problems = []
    if not getattr(text, "use_qk_norm", True):
        problems.append("use_qk_norm is false")
    if getattr(text, "shared_expert_intermediate_size", 0):
        problems.append("it has a shared expert")
    check_plain_decoder(text, "thinker", problems)


def stop_ids(release: Path) -> list[int]:
    """The ids that end a thinker's reply: the configuration's <|im_end|> (a chat turn's end),
    then any other eos ids the release's generation_config.json names."""
    config = json.loads((Path(release) / "config.json").read_text())
    stops = [int(config["im_end_token_id"])]
    eos = _release_generation(release).get("eos_token_id")
    for token in eos if isinstance(eos, list) else [eos] if eos is not None else []:
        if int(token) not in stops:
            stops.append(int(token))
    return stops


def _pad_id(release: Path) -> dict[str, int]:
    """{"pad_token_id": id} where the release's generation config or text config names one."""
    pad = _release_generation(release).get("pad_token_id", text_config(release).pad_token_id)
    return {} if pad is None else {"pad_token_id": int(pad)}


def _release_generation(release: Path) -> dict[str, Any]:
    """The release's generation_config.json ({} if it has none)."""
    path = Path(release) / GENERATION_CONFIG
    return json.loads(path.read_text()) if path.is_file() else {}
