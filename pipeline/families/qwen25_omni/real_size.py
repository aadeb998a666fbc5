"""Qwen2.5-Omni-7B at its real size with no weights: config, weightless release, stage sizes.

transformers' `Qwen2_5OmniConfig()` defaults give the 7B release's thinker (text model, audio
and vision towers) and token2wav, but not its talker: the default talker copies the thinker's
widths (3584 wide, 28 layers, about 6.6B), where the release's is 896 wide with 24 layers of 12
heads of 128 (`REAL_TALKER`, from Qwen/Qwen2.5-Omni-7B's config.json; docs/profiles.md's "12 heads
of 128 in 896 widths"). The release also unties the thinker's lm_head. The default vision
tower (3.1B) is not the release's either (0.67B); no stage loads it, so it stays as it is.
The tokenizer is the tiny one (the real one cannot be downloaded here): its special ids lie
inside the real vocabulary, which keeps its 152064 rows. The release's safetensors shards are
sparse (`dummy_weights.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

from pipeline.families.kit.dummy_weights import (
    meta_tensors,
    part_sizes,
    write_sparse_checkpoint,
)
from pipeline.families.qwen25_omni import tiny_tokenizer
from pipeline.families.qwen25_omni.release import (
    ARCHITECTURE,
    generation_config,
    write_release_files,
)
from pipeline.families.qwen25_omni.tiny_config import tiny_config

REAL_TALKER = {"hidden_size": 896, "intermediate_size": 18944, "num_hidden_layers": 24,
               "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 128}
THINKER_IDS = ("audio_token_index", "image_token_index", "video_token_index",
               "audio_start_token_id", "audio_end_token_id", "user_token_id",
               "vision_start_token_id", "vision_end_token_id", "vision_token_id", "pad_token_id")
TALKER_TEXT_IDS = ("audio_token_index", "image_token_index", "video_token_index",
                   "vision_start_token_id", "vision_end_token_id", "audio_start_token_id",
                   "audio_end_token_id", "tts_text_start_token_id", "tts_text_end_token_id",
                   "tts_text_pad_token_id")  # the codec's own ids keep the real values
# What each stage holds, by release prefix (the vision tower is never loaded: audio and text
# only). The thinker's LM is held twice: by vLLM and by the worker's hidden-state model.
THINKER_LM = ("thinker.model.", "thinker.lm_head.")
STAGE_PARTS: dict[str, dict[str, tuple[str, ...]]] = {
    "thinker": {"thinker LM (vLLM)": THINKER_LM, "thinker LM states (torch)": THINKER_LM,
                "audio tower (torch)": ("thinker.audio_tower.",)},
    "talker": {"talker LM (vLLM)": ("talker.",)},
    "voicebox": {"token2wav (torch)": ("token2wav.",)},
}


def real_config() -> Qwen2_5OmniConfig:
    """Qwen2.5-Omni-7B's configuration, with the tiny tokenizer's special ids."""
    ids = tiny_tokenizer.token_ids(tiny_tokenizer.train_tokenizer())
    tiny: Any = tiny_config(ids)
    talker = {key: getattr(tiny.talker_config, key) for key in TALKER_TEXT_IDS} | REAL_TALKER
    config: Any = Qwen2_5OmniConfig(talker_config=talker, enable_audio_output=True)
    config.architectures = [ARCHITECTURE]
    _copy(tiny.thinker_config, config.thinker_config, THINKER_IDS)
    _copy(tiny.thinker_config.text_config, config.thinker_config.text_config,
          ("pad_token_id", "eos_token_id"))
    config.thinker_config.text_config.tie_word_embeddings = False
    return config  # type: ignore[no-any-return]  # built as Any for its sub-configs


def write_dummy_release(directory: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """Write a weightless Qwen2.5-Omni-7B release into `directory`; its tensors (meta)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer.train_tokenizer()
    ids = tiny_tokenizer.token_ids(tokenizer)
    config = real_config()
    tensors = release_tensors(config)
    config.save_pretrained(directory)
    generation_config(ids).save_pretrained(directory)
    write_sparse_checkpoint(directory, tensors)
    write_release_files(directory, tokenizer, config, seed)
    return tensors


def release_tensors(config: Qwen2_5OmniConfig) -> dict[str, torch.Tensor]:
    """The release model's state dict on the meta device."""
    return meta_tensors(lambda: Qwen2_5OmniForConditionalGeneration(config))


def stage_sizes(tensors: dict[str, torch.Tensor], states_bytes: int = 2) -> dict[str, Any]:
    """Per stage and part: parameters and weight memory in bytes (bfloat16, as the `omni`
    profile places them on a GPU; the thinker's hidden-state model at `states_bytes` per
    parameter)."""
    return part_sizes(tensors, STAGE_PARTS, states_bytes)


def _copy(source: Any, target: Any, keys: tuple[str, ...]) -> None:
    for key in keys:
        setattr(target, key, getattr(source, key))
