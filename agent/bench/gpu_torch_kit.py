"""What `omnivox bench gpu-torch` builds and how it times it: the parts' configurations at real or
tiny size, random weights made directly on the target device, their sizes, CUDA-synchronised
clocks.

Real size is the published one: transformers' `Qwen2_5OmniConfig()` defaults are
Qwen2.5-Omni-7B's thinker (text model and audio tower) and token2wav
(pipeline/families/qwen25_omni/real_size.py), SNAC is the released snac_24khz's constructor
arguments. Tiny is the families' own tiny builds. Nothing here imports vLLM or the server.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import torch
from transformers import Qwen2_5OmniConfig, Qwen2Config

from pipeline.families.qwen25_omni.tiny_config import TokenIds, tiny_config

M = TypeVar("M", bound=torch.nn.Module)
GIB = float(2**30)
REPEATS = 3  # timings per figure (their median), after one warm-up
UTTERANCE_S = (1.0, 2.0, 8.0)  # the audio encoders' utterances


@dataclass(frozen=True)
class Target:
    """Where and at what size the parts run."""

    size: str  # "real" or "tiny"
    device: torch.device
    dtype: torch.dtype

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def omni_config(size: str) -> Qwen2_5OmniConfig:
    """Qwen2.5-Omni-7B's configuration (real), or the family's tiny one."""
    if size == "real":
        return Qwen2_5OmniConfig()
    # the tiny config's special ids only name rows of the thinker's vocabulary: any will do
    ids = {field.name: 400 + i for i, field in enumerate(fields(TokenIds))}
    return tiny_config(TokenIds(**(ids | {"vocab_size": 512})))


def thinker_config(size: str) -> Any:
    """The thinker's sub-config (`audio_config`, `text_config`) at `size`."""
    config: Any = omni_config(size)  # its sub-configs are typed as unions
    return config.thinker_config


def snac_config(size: str) -> dict[str, Any]:
    """SNAC 24 kHz's constructor arguments (real), or the orpheus family's tiny ones (the 24 kHz
    framing at small widths). Imports the `snac` package: ImportError where it is absent."""
    from pipeline.families.orpheus.snac_decoder import SNAC_24KHZ

    if size == "real":
        return SNAC_24KHZ
    from pipeline.families.orpheus.build import TINY_SNAC

    return TINY_SNAC


def qwen2_config(text: Any, layers: int) -> Qwen2Config:
    """The thinker's text model as a plain Qwen2 (what the Thinker's hidden-state model loads,
    1-D RoPE), with `layers` of its layers."""
    rope = text.rope_parameters or {}
    return Qwen2Config(
        vocab_size=text.vocab_size, hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size, num_hidden_layers=layers,
        num_attention_heads=text.num_attention_heads,
        num_key_value_heads=text.num_key_value_heads, hidden_act=text.hidden_act,
        max_position_embeddings=text.max_position_embeddings, rms_norm_eps=text.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": rope.get("rope_theta", 1e6)})


def on_device(build: Callable[[], M], device: torch.device,
              dtype: torch.dtype | None = None) -> M:
    """`build()` with its parameters created, and randomly initialised, on `device` itself
    (no CPU copy to move); on "meta" only shapes (for sizing). With `dtype`, its floating
    buffers too are cast (transformers' `dtype` leaves BigVGAN's filters in float32)."""
    with torch.device(device):
        module = build()
    torch.nn.Module.to(module, device, dtype)  # in place; the device: in case a builder ignored it
    return module.eval()


def parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def weight_gib(module: torch.nn.Module) -> float:
    return sum(p.numel() * p.element_size() for p in module.parameters()) / GIB


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a timing's edge); nothing on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(run: Callable[[], object], device: torch.device) -> float:
    """Seconds `run()` takes, its device work included."""
    synchronize(device)
    began = time.perf_counter()
    run()
    synchronize(device)
    return time.perf_counter() - began


def median_s(run: Callable[[], object], device: torch.device, repeats: int) -> float:
    """The median of `repeats` timings of `run()`, after one untimed warm-up."""
    run()
    return statistics.median(timed(run, device) for _ in range(repeats))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def figure(value: float) -> float:
    """A figure for the JSON: four significant digits."""
    return float(f"{value:.4g}")
