"""The tiny Thinker's audio encoder: 16 kHz speech to embeddings in the LLM's hidden space.

Log-mel frames (80 mels, 25 ms window, 10 ms hop) pass through two stride-2 convolutions
(4x fewer frames: one embedding per 40 ms) and a linear map to the LLM's hidden size. The mel
filterbank is stored with the weights, as Whisper-style checkpoints do.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

SAMPLE_RATE = 16_000
N_FFT = 400  # 25 ms
HOP = 160  # 10 ms
N_MELS = 80
DOWNSAMPLE = 4


def mel_filterbank(n_mels: int, n_fft: int, sample_rate: int) -> torch.Tensor:
    """Triangular HTK-mel filters, shape (n_mels, n_fft // 2 + 1), area-normalised (Slaney)."""

    def hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
        return 2595.0 * torch.log10(1.0 + hz / 700.0)

    def mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
        return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)

    freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    edges = mel_to_hz(torch.linspace(0, float(hz_to_mel(torch.tensor(sample_rate / 2.0))),
                                     n_mels + 2, dtype=torch.float64))
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (freqs - lower) / (centre - lower)
    falling = (upper - freqs) / (upper - centre)
    filters = torch.clamp(torch.minimum(rising, falling), min=0.0)
    filters *= (2.0 / (upper - lower))  # equal area per filter
    return filters.float()


def log_mel(wave: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    """Log-mel frames (frames, n_mels) of a mono float waveform in [-1, 1]."""
    window = torch.hann_window(N_FFT)
    spec = torch.stft(wave, N_FFT, HOP, window=window, return_complex=True).abs() ** 2
    mel = torch.clamp(filters @ spec, min=1e-10).log10()
    mel = torch.maximum(mel, mel.max() - 8.0)  # 80 dB dynamic range, as Whisper does
    return ((mel + 4.0) / 4.0).T


class TinyAudioEncoder(nn.Module):
    """Log-mel frames -> (frames / 4, hidden) embeddings."""

    mel_filters: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, hidden_size: int, width: int = 128) -> None:
        super().__init__()
        self.register_buffer("mel_filters", mel_filterbank(N_MELS, N_FFT, SAMPLE_RATE))
        self.conv1 = nn.Conv1d(N_MELS, width, kernel_size=3, stride=2, padding=1)
        self.conv2 = nn.Conv1d(width, width, kernel_size=3, stride=2, padding=1)
        self.proj = nn.Linear(width, hidden_size)
        self.out_scale = 0.02  # outputs on the scale of the LLM's own token embeddings

    @torch.inference_mode()
    def forward(self, pcm16: torch.Tensor) -> torch.Tensor:
        """Encode a 16 kHz mono int16 (or float) utterance; at least one embedding."""
        wave = pcm16.float() / 32768.0 if not pcm16.is_floating_point() else pcm16.float()
        if wave.numel() < N_FFT:
            wave = torch.nn.functional.pad(wave, (0, N_FFT - wave.numel()))
        frames = log_mel(wave, self.mel_filters).T.unsqueeze(0)  # (1, mels, T)
        x: torch.Tensor = nn.functional.gelu(self.conv1(frames))
        x = nn.functional.gelu(self.conv2(x))
        x = self.proj(x.squeeze(0).T)
        return x / (x.std() + 1e-6) * self.out_scale

    @staticmethod
    def frames_for(samples: int) -> int:
        """Embeddings produced for an utterance of `samples` samples at 16 kHz."""
        mel_frames = max(samples, N_FFT) // HOP + 1
        return math.ceil(math.ceil(mel_frames / 2) / 2)


def write_audio_encoder(directory: Path, hidden_size: int, seed: int) -> None:
    """Write a randomly initialised encoder: config.json + model.safetensors in `directory`.

    A directory of its own: vLLM loads every *.safetensors beside the LLM's config.json.
    """
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)  # nn.Module init draws from the global generator
    encoder = TinyAudioEncoder(hidden_size)
    state = {k: v.contiguous() for k, v in encoder.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = {"hidden_size": hidden_size, "sample_rate": SAMPLE_RATE, "n_mels": N_MELS,
              "hop": HOP, "downsample": DOWNSAMPLE}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_audio_encoder(directory: Path) -> TinyAudioEncoder:
    """Load the encoder written by `write_audio_encoder`."""
    config = json.loads((directory / "config.json").read_text())
    encoder = TinyAudioEncoder(config["hidden_size"])
    encoder.load_state_dict(load_file(str(directory / "model.safetensors")))
    return encoder.eval()
