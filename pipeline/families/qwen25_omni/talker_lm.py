"""Qwen2.5-Omni's Talker converted to a plain causal LM that stock vLLM serves, and its extras.

The reference talker (`Qwen2_5OmniTalkerForConditionalGeneration`) feeds its decoder
`thinker_to_talker_proj(codec_embedding[code] + side)`, where `side` is a thinker-sized row: the
reply text's thinker rows while they last, then the text-eos row, then the text-pad row for
ever. The projection is linear, so with W, b its weight and bias

    proj(codec[c] + side) = E[c] + W (side - pad),   E[c] = W codec[c] + W pad + b.

E is the converted LM's input embedding: once the side input is the pad row, the talker is
exactly a causal LM over codec ids, with lm_head = codec_head. Before that, the driver
(`talker_steps`) hands vLLM the rows itself as prompt embeddings, adding W (side - pad).
M-RoPE's three position components are equal for text and audio prompts, so 1-D RoPE is the
same computation. The real release's talker has head_dim 128 with 12 heads in a 896-wide
model. vLLM's Qwen2 class cannot express that (it derives head_dim = hidden / heads), and
transformers' LlamaConfig, which vLLM would parse a `llama` config.json with, refuses it (hidden
not a multiple of the heads). So the LM is written with architecture `LlamaForCausalLM` (vLLM's
Llama class reads head_dim, and with `qkv_bias` it has q/k/v biases and none on o_proj:
Qwen2's layer exactly) and model_type `qwen2` (Qwen2Config takes head_dim as given; loaded by
transformers, the same directory is a Qwen2ForCausalLM computing the same thing).

`talker_extra/` (a directory of its own: vLLM loads every *.safetensors beside config.json)
holds W, b, the thinker's text-pad, text-eos and per-voice text-bos rows, and the codec ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pipeline.families.kit.build_support import write_json

LM_DIR = "talker_lm"  # the converted talker's place in the family directory
EXTRA_DIR = "talker_extra"
SPEAKERS_FILE = "spk_dict.pt"  # the release's voices: name -> {"bos_token": text-bos id, ...}
_TALKER = "talker."
_THINKER_EMBED = "thinker.model.embed_tokens.weight"


@dataclass(frozen=True)
class CodecIds:
    """The codec vocabulary's special ids (the talker config's tts_codec_* ids)."""

    bos: int
    eos: int
    pad: int
    mask: int
    vocab_size: int
    speech_codes: int  # ids 0..speech_codes-1 are what token2wav renders

    @property
    def stops(self) -> list[int]:
        """Codes that end the speech: the reference generate()'s talker_eos_token_id default
        is [pad, eos]."""
        return [self.eos, self.pad]

    def reference_allowed(self) -> list[int]:
        """Every id but codec bos, which the reference suppresses (suppress_tokens): what
        parity with it needs."""
        return [code for code in range(self.vocab_size) if code != self.bos]

    def speech_allowed(self) -> list[int]:
        """Speech codes and the stops: a trained talker samples nothing else, and a random
        one must not hand token2wav an id outside its codebook."""
        return list(range(self.speech_codes)) + self.stops


@dataclass(frozen=True)
class TalkerExtras:
    """What the driver needs beside the LM: the projection and the thinker's text rows."""

    projection_w: torch.Tensor  # (talker_hidden, thinker_hidden)
    projection_b: torch.Tensor  # (talker_hidden,)
    text_pad: torch.Tensor  # (thinker_hidden,) thinker embedding of tts_text_pad
    text_eos: torch.Tensor  # (thinker_hidden,) thinker embedding of tts_text_end
    text_bos: dict[str, torch.Tensor]  # voice -> thinker embedding of its text-bos token
    codec: CodecIds

    @classmethod
    def load(cls, lm_dir: Path) -> TalkerExtras:
        """Read them from a converted talker directory (float32, on the CPU)."""
        directory = lm_dir / EXTRA_DIR
        meta = json.loads((directory / "config.json").read_text())
        tensors = load_file(str(directory / "model.safetensors"))
        voices = {name: tensors[f"text_bos.{name}"] for name in meta["voices"]}
        return cls(tensors["projection.weight"], tensors["projection.bias"],
                   tensors["text_pad"], tensors["text_eos"], voices, CodecIds(**meta["codec"]))

    def project(self, rows: torch.Tensor) -> torch.Tensor:
        """thinker_to_talker_proj of (n, thinker_hidden) rows: the prompt part's rows."""
        return rows.float() @ self.projection_w.T + self.projection_b

    def side(self, rows: torch.Tensor) -> torch.Tensor:
        """W (rows - pad): what a side input adds to the LM's own embedding of a code."""
        return (rows.float() - self.text_pad) @ self.projection_w.T


def load_lm_embedding(lm_dir: Path) -> torch.Tensor:
    """The converted LM's input embedding E (codec vocab, talker_hidden), float32."""
    with safe_open(str(lm_dir / "model.safetensors"), "pt") as weights:
        table: torch.Tensor = weights.get_tensor("model.embed_tokens.weight")
    return table.float()


def convert_talker(release: Path, out: Path) -> None:
    """Write the release's talker as a vLLM-servable LM directory `out`, extras included.

    `release` is a Qwen2.5-Omni checkpoint in the Hugging Face layout (config.json,
    model.safetensors or an index of shards, spk_dict.pt).
    """
    config = json.loads((release / "config.json").read_text())
    talker = _talker_config(config)
    weights = dict(_release_tensors(release, _TALKER, _THINKER_EMBED))
    thinker_embed = weights.pop(_THINKER_EMBED)
    codec = CodecIds(talker["tts_codec_start_token_id"], talker["tts_codec_end_token_id"],
                     talker["tts_codec_pad_token_id"], talker["tts_codec_mask_token_id"],
                     talker["vocab_size"], _speech_codes(config, talker["vocab_size"]))
    w = weights[_TALKER + "thinker_to_talker_proj.weight"].float()
    b = weights[_TALKER + "thinker_to_talker_proj.bias"].float()
    pad_row = thinker_embed[talker["tts_text_pad_token_id"]].float()
    codec_embed = weights[_TALKER + "model.embed_tokens.weight"]
    lm_embed = codec_embed.float() @ w.T + (w @ pad_row + b)
    lm = {_lm_name(name): tensor for name, tensor in weights.items()
          if not name.startswith(_TALKER + "thinker_to_talker_proj.")}
    lm["model.embed_tokens.weight"] = lm_embed.to(codec_embed.dtype)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in lm.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    write_json(out / "config.json", _lm_config(talker, codec, str(codec_embed.dtype)))
    write_json(out / "generation_config.json", {"eos_token_id": codec.stops})
    voices = _voice_bos_ids(release)
    extras = {"projection.weight": w, "projection.bias": b, "text_pad": pad_row,
              "text_eos": thinker_embed[talker["tts_text_end_token_id"]].float()}
    extras.update({f"text_bos.{name}": thinker_embed[token].float()
                   for name, token in voices.items()})
    (out / EXTRA_DIR).mkdir(exist_ok=True)
    save_file({k: v.contiguous() for k, v in extras.items()},
              str(out / EXTRA_DIR / "model.safetensors"), metadata={"format": "pt"})
    write_json(out / EXTRA_DIR / "config.json",
                {"voices": list(voices), "codec": codec.__dict__})


def _talker_config(config: dict[str, Any]) -> dict[str, Any]:
    """The release's talker config with transformers' defaults filled in (the real release's
    config.json leaves some out, head_dim among them)."""
    from transformers import Qwen2_5OmniTalkerConfig

    return Qwen2_5OmniTalkerConfig(**config["talker_config"]).to_dict()


def _speech_codes(config: dict[str, Any], vocab_size: int) -> int:
    """How many codes token2wav renders: its DiT's codec embedding has one row more."""
    dit = config.get("token2wav_config", {}).get("dit_config", {})
    return int(dit["num_embeds"]) - 1 if "num_embeds" in dit else vocab_size


def _lm_config(talker: dict[str, Any], codec: CodecIds, dtype: str) -> dict[str, Any]:
    """config.json of the converted LM: the talker's decoder sizes, 1-D RoPE."""
    rope = talker.get("rope_parameters") or {}
    theta = rope.get("rope_theta", talker.get("rope_theta", 1000000.0))
    return {
        "architectures": ["LlamaForCausalLM"],  # vLLM's class: reads head_dim and qkv_bias
        "model_type": "qwen2",  # the config class: takes head_dim as given
        "vocab_size": talker["vocab_size"],
        "hidden_size": talker["hidden_size"],
        "intermediate_size": talker["intermediate_size"],
        "num_hidden_layers": talker["num_hidden_layers"],
        "num_attention_heads": talker["num_attention_heads"],
        "num_key_value_heads": talker["num_key_value_heads"],
        "head_dim": talker["head_dim"],
        "hidden_act": talker["hidden_act"],
        "max_position_embeddings": talker["max_position_embeddings"],
        "rms_norm_eps": talker["rms_norm_eps"],
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "attention_bias": False,  # o_proj has none ...
        "qkv_bias": True,  # ... q, k and v have theirs (vLLM's Llama reads this key)
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": codec.bos,
        "eos_token_id": codec.eos,
        "dtype": dtype.removeprefix("torch."),
    }


def _lm_name(name: str) -> str:
    """A release tensor name under the converted LM's names."""
    name = name.removeprefix(_TALKER)
    return "lm_head.weight" if name == "codec_head.weight" else name


def _release_tensors(release: Path, prefix: str, *names: str) -> Iterator[tuple[str, Any]]:
    """The release's tensors under `prefix` and those named, from one file or its shards."""
    index = release / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    for shard in shards:
        with safe_open(str(release / shard), "pt") as weights:
            for name in weights.keys():  # noqa: SIM118 (safe_open is no mapping)
                if name.startswith(prefix) or name in names:
                    yield name, weights.get_tensor(name)


def _voice_bos_ids(release: Path) -> dict[str, int]:
    """Each voice's text-bos token id, from the release's spk_dict.pt."""
    path = release / SPEAKERS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{release} has no {SPEAKERS_FILE}: the talker's voices (their "
                                f"text-bos tokens) come from it")
    speakers = torch.load(path, weights_only=True)
    return {str(name): int(entry["bos_token"]) for name, entry in speakers.items()}
