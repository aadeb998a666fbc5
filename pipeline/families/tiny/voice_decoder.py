"""The tiny VoiceBox's decoder: speech tokens to a 24 kHz waveform (one token = 20 ms).

Token embeddings pass a convolution, then transposed convolutions upsample 2 x 4 x 6 x 10 = 480
samples per token, and a final convolution, a fixed band-pass and tanh give the waveform. The
band-pass keeps the output of random weights in the speech band (100 Hz to 3.4 kHz), where
voice codecs spend their bits: unfiltered, it is mostly a DC offset (which Opus removes) and
noise near 12 kHz (which Opus at voice bitrates, and G.711, drop). Random weights are
calibrated at build time so that the output sits at a sane speech level (RMS about 0.1).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

TARGET_RMS = 0.15  # pre-tanh level the build calibrates to


@dataclass(frozen=True)
class VoiceDecoderConfig:
    """Sizes of the decoder, stored as config.json beside its weights."""

    n_codes: int = 256
    embed_dim: int = 64
    channels: int = 128
    upsample: tuple[int, ...] = (2, 4, 6, 10)  # product = samples per token
    sample_rate: int = 24_000
    band_hz: tuple[float, float] = (100.0, 3_400.0)
    band_taps: int = 255  # long enough for the 100 Hz edge

    @property
    def samples_per_token(self) -> int:
        total = 1
        for factor in self.upsample:
            total *= factor
        return total


class TinyVoiceDecoder(nn.Module):
    """(batch, tokens) speech codes -> (batch, tokens * samples_per_token) waveform in [-1, 1]."""

    bandpass: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, config: VoiceDecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.n_codes, config.embed_dim)
        self.pre = nn.Conv1d(config.embed_dim, config.channels, kernel_size=3, padding=1)
        ups, width = [], config.channels
        for factor in config.upsample:  # even factors: kernel 2f, padding f/2 -> exactly L * f
            ups.append(nn.ConvTranspose1d(width, width // 2, 2 * factor, factor, factor // 2))
            width //= 2
        self.ups = nn.ModuleList(ups)
        self.post = nn.Conv1d(width, 1, kernel_size=7, padding=3)
        self.register_buffer("bandpass", _bandpass_kernel(config), persistent=False)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.pre_tanh(tokens))

    @torch.inference_mode()
    def pre_tanh(self, tokens: torch.Tensor) -> torch.Tensor:
        """(batch, samples) before the last step, the tanh: a caller may run that step itself
        with its own `out=` (the VoiceBox writes it straight into a pool block)."""
        x = self.embed(tokens).transpose(1, 2)  # (B, E, L)
        x = nn.functional.leaky_relu(self.pre(x), 0.1)
        for up in self.ups:
            x = nn.functional.leaky_relu(up(x), 0.1)
        x = nn.functional.conv1d(self.post(x), self.bandpass, padding=self.bandpass.shape[-1] // 2)
        return x.squeeze(1)


def _bandpass_kernel(config: VoiceDecoderConfig) -> torch.Tensor:
    """A Hamming-windowed sinc band-pass FIR (difference of two low-passes), shape (1, 1, taps)."""
    taps = config.band_taps
    n = torch.arange(taps, dtype=torch.float64) - (taps - 1) / 2
    window = torch.hamming_window(taps, False, dtype=torch.float64)

    def lowpass(hz: float) -> torch.Tensor:
        cutoff = hz / config.sample_rate
        kernel = 2 * cutoff * torch.sinc(2 * cutoff * n) * window
        return kernel / kernel.sum()

    low, high = config.band_hz
    return (lowpass(high) - lowpass(low)).float().view(1, 1, -1)


def _calibrate(decoder: TinyVoiceDecoder, generator: torch.Generator) -> None:
    """Scale the last layer so random tokens come out at TARGET_RMS before the tanh."""
    config = decoder.config
    tokens = torch.randint(0, config.n_codes, (4, 50), generator=generator)
    with torch.inference_mode():
        pre_tanh = torch.atanh(decoder(tokens).clamp(-0.999999, 0.999999))
    # Rounded: the gain must not depend on float summation order (thread count) or the
    # checksum of the build would change from machine to machine.
    gain = round(TARGET_RMS / float(pre_tanh.double().pow(2).mean().sqrt()), 3)
    with torch.no_grad():
        decoder.post.weight.mul_(gain)
        assert decoder.post.bias is not None  # post is a Conv1d built with a bias
        decoder.post.bias.mul_(gain)


def write_voice_decoder(directory: Path, config: VoiceDecoderConfig, seed: int) -> None:
    """Write a random, level-calibrated decoder (config.json + model.safetensors)."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    decoder = TinyVoiceDecoder(config)
    _calibrate(decoder, torch.Generator().manual_seed(seed + 1))
    state = {k: v.contiguous() for k, v in decoder.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(asdict(config), indent=2) + "\n")


def load_voice_decoder(directory: Path) -> TinyVoiceDecoder:
    """Load the decoder written by `write_voice_decoder`."""
    raw = json.loads((directory / "config.json").read_text())
    config = VoiceDecoderConfig(
        **(raw | {"upsample": tuple(raw["upsample"]), "band_hz": tuple(raw["band_hz"])})
    )
    decoder = TinyVoiceDecoder(config)
    decoder.load_state_dict(load_file(str(directory / "model.safetensors")))
    return decoder.eval()
