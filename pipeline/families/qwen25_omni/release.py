"""Qwen2.5-Omni release directories: the tiny random one we build, and checks on any one.

A release directory has the Hugging Face layout of the published Qwen2.5-Omni checkpoints:
config.json (architecture `Qwen2_5OmniModel` as published, or
`Qwen2_5OmniForConditionalGeneration` as transformers writes it), the safetensors weights of
thinker, talker and token2wav, generation_config.json, the tokenizer files,
preprocessor_config.json (the Whisper feature extractor) and spk_dict.pt (the speakers). The
stages read real and tiny releases with the same code.

The tiny release is transformers' own model class at the sizes of `tiny_config`, with RANDOM
weights from a fixed torch seed: it exercises the real architecture, it says nothing. Its
Linear biases are random too (`random_biases`): transformers' initialisation zeroes them, and a
parity test over zero biases cannot see a converter that drops one (real Qwen2 q/k/v biases are
large).
The processor itself is not saved (its video part needs torchvision, which the CPU torch here
cannot load): its tokenizer and feature extractor are, which is all the audio path reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import (
    GenerationConfig,
    Qwen2_5OmniConfig,
    Qwen2_5OmniForConditionalGeneration,
    WhisperFeatureExtractor,
)

from pipeline.families.kit.hf_release import checked_release_config, hearing_files
from pipeline.families.kit.release_tensors import release_tensor_names
from pipeline.families.qwen25_omni import tiny_tokenizer
from pipeline.families.qwen25_omni.tiny_config import TokenIds, tiny_config

ARCHITECTURE = "Qwen2_5OmniModel"  # what the published config.json names
ARCHITECTURES = (ARCHITECTURE, "Qwen2_5OmniForConditionalGeneration")  # either is accepted
MODEL_TYPE = "qwen2_5_omni"
N_MELS = 128  # the audio tower's mel bins (the real release's WhisperFeatureExtractor)
THINKER_HEAD = "thinker.lm_head.weight"
REF_MEL_FRAMES = 30  # the tiny speakers' reference mel length
BIAS_STD = 0.1  # random Linear biases: about half a projection's output spread at init
DEFAULT_SPEAKER = "Chelsie"  # the reference generate()'s speaker, for the voice "default"


# The tiny BigVGAN's random convolutions shrink the signal at each layer: its output peaked at
# 2.6e-8 (RMS 6e-9, 40 random codes). Its last convolution, which has no bias, is scaled so
# the noise peaks near a quarter of full scale and a caller hears the reply.
BIGVGAN_GAIN = 1e7


def write_tiny_release(directory: Path, seed: int) -> None:
    """Write a tiny Qwen2.5-Omni release (random weights from `seed`) into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer.train_tokenizer()
    ids = tiny_tokenizer.token_ids(tokenizer)
    config = tiny_config(ids)
    torch.manual_seed(seed)
    model = Qwen2_5OmniForConditionalGeneration(config).eval()
    random_biases(model, torch.Generator().manual_seed(seed + 2))
    with torch.no_grad():  # random weights speak at ~1e-8 of full scale: make the noise heard
        model.token2wav.code2wav_bigvgan_model.conv_post.weight.mul_(BIGVGAN_GAIN)
    model.generation_config = generation_config(ids)
    model.save_pretrained(directory)
    name_architecture(directory)
    write_release_files(directory, tokenizer, config, seed)


@torch.no_grad()
def random_biases(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Give every Linear bias of `model` random values (normal, BIAS_STD)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            module.bias.copy_(torch.randn(module.bias.shape, generator=generator) * BIAS_STD)


def name_architecture(directory: Path) -> None:
    """Name the architecture in config.json as the published release does (transformers
    writes its class's name), so the tiny release is laid out exactly as a real one."""
    path = Path(directory) / "config.json"
    config = json.loads(path.read_text())
    config["architectures"] = [ARCHITECTURE]
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def generation_config(ids: TokenIds) -> GenerationConfig:
    """The release's generation config: a reply ends at <|im_end|> or the pad id."""
    return GenerationConfig(eos_token_id=[ids.im_end, ids.pad], pad_token_id=ids.pad)


def write_release_files(directory: Path, tokenizer: Tokenizer, config: Qwen2_5OmniConfig,
                        seed: int) -> None:
    """What a release holds beside config and weights: the tokenizer, the feature extractor
    and spk_dict.pt (random speakers of the config's sizes, from `seed`)."""
    tiny_tokenizer.save_tokenizer(tokenizer, directory)
    WhisperFeatureExtractor(feature_size=N_MELS).save_pretrained(directory)
    token2wav: Any = config.token2wav_config  # a sub-config (typed as dict | config | None)
    dit = token2wav.dit_config
    generator = torch.Generator().manual_seed(seed + 1)
    speakers = {
        name: {"bos_token": tokenizer.token_to_id(token),
               "cond": torch.randn(1, dit.enc_emb_dim, generator=generator),
               "ref_mel": torch.randn(1, REF_MEL_FRAMES, dit.mel_dim, generator=generator)}
        for name, token in tiny_tokenizer.SPEAKERS.items()}
    torch.save(speakers, directory / "spk_dict.pt")


def check_release(directory: Path) -> dict:
    """The release's config.json, or a clear error naming what is missing or wrong."""
    directory = Path(directory)
    config = checked_release_config(directory, "Qwen2.5-Omni",
                                    "download Qwen/Qwen2.5-Omni-7B or -3B there", MODEL_TYPE,
                                    ARCHITECTURES, _required_files(directory))
    if not thinker_head_tied(directory) and THINKER_HEAD not in release_tensor_names(directory):
        raise ValueError(f"Qwen2.5-Omni release at {directory} lacks {THINKER_HEAD}: its "
                         "config.json says the thinker's embeddings are not tied")
    return config


def thinker_head_tied(release: Path) -> bool:
    """Whether the thinker's lm_head is its input embedding (tie_word_embeddings, which the
    smaller release may set), as its text config says."""
    config = json.loads((Path(release) / "config.json").read_text())
    text = config.get("thinker_config", {}).get("text_config", {})
    return bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))


def speaker_for(voice: str, speakers: list[str]) -> str:
    """The release speaker a job's voice names: "default" is Chelsie (the reference's) where
    the release has her, else its first; the Talker and the VoiceBox both choose by this."""
    if voice == "default":
        return DEFAULT_SPEAKER if DEFAULT_SPEAKER in speakers else speakers[0]
    if voice not in speakers:
        raise ValueError(f"unknown voice {voice!r}; this release has {speakers}")
    return voice


def _required_files(directory: Path) -> list[str]:
    """What must be there beside the weights before anything starts."""
    return [*hearing_files(directory), "spk_dict.pt"]
