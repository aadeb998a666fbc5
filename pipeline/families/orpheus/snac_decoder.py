"""SNAC's 24 kHz decoder (the `snac` package's own model class) over decode windows.

The model directory is laid out as the released `hubertsiuzdak/snac_24khz`: config.json (the
SNAC constructor's arguments) and pytorch_model.bin (its state dict), so a real checkpoint
loads with the same code. Windows of the same length decode in one batched forward; each
window's voiced frames are cut out of its audio.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from snac import SNAC

from pipeline.families.orpheus.codes import codebooks
from pipeline.families.orpheus.windows import Window

# SNAC 24 kHz's framing (hubertsiuzdak/snac_24khz): the tiny build keeps it, with small widths.
SNAC_24KHZ: dict[str, Any] = {
    "sampling_rate": 24000,
    "encoder_dim": 48,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}


def write_snac(directory: Path, config: dict[str, Any], seed: int) -> None:
    """Write a SNAC model of `config` with random weights (its own initialisation, seeded)."""
    directory.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = SNAC(**config)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    torch.save(model.state_dict(), directory / "pytorch_model.bin")


class SnacDecoder:
    """A SNAC model in eval mode that renders decode windows."""

    def __init__(self, model: SNAC, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.model = model.eval().to(self.device)
        self.sample_rate = int(model.sampling_rate)
        # codebook 0 has one code per frame: a frame is its stride in latent steps
        self.samples_per_frame = int(model.hop_length) * int(model.vq_strides[0])

    @classmethod
    def load(cls, directory: Path, device: str = "cpu") -> SnacDecoder:
        """Load config.json and pytorch_model.bin from a model directory (no hub), onto
        `device` ("cuda" on a GPU host)."""
        if not (directory / "config.json").is_file():
            raise FileNotFoundError(f"no SNAC model at {directory} (config.json missing)")
        return cls(SNAC.from_pretrained(str(directory)), device)

    @torch.inference_mode()
    def decode(self, frames: torch.Tensor) -> torch.Tensor:
        """(batch, n, 7) frames of codes to (batch, n * samples_per_frame) audio."""
        audio: torch.Tensor = self.model.decode(codebooks(frames))
        return audio.squeeze(1)

    def render(self, windows: list[Window]) -> list[torch.Tensor]:
        """Each window's voiced audio, in order; windows of one length share a forward."""
        by_length: dict[int, list[int]] = {}
        for index, window in enumerate(windows):
            by_length.setdefault(len(window.frames), []).append(index)
        audio: list[torch.Tensor] = [torch.empty(0)] * len(windows)
        step = self.samples_per_frame
        for indices in by_length.values():
            batch = torch.tensor([windows[i].frames for i in indices], dtype=torch.long,
                                 device=self.device)
            for row, index in zip(self.decode(batch), indices, strict=True):
                window = windows[index]
                audio[index] = row[window.context * step:(window.context + window.voiced) * step]
        return audio
