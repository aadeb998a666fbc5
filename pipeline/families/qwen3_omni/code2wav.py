"""Qwen3-Omni's code2wav rendered as a stream: audio for the talker's frames as they come.

The reference (`Qwen3OmniMoeCode2Wav.forward`) turns a whole utterance's frames (16 codes each,
one per codebook) into a waveform at once: each frame's 16 code embeddings averaged, a
transformer with causal sliding-window attention, two transposed convolutions upsampling 2x
(each followed by a ConvNeXt block), a convolution, four decoder blocks (SnakeBeta, a transposed
convolution upsampling 8, 5, 4 and 3x, three residual units of dilated convolutions), SnakeBeta,
a last convolution, and a clamp to [-1, 1]: 1920 samples a frame at 24 kHz.

Every one of those layers is causal, so no lookahead is needed: a stream that keeps each
layer's left context gives, after any T frames, exactly the reference's decode of those T
frames. `StreamingCode2Wav` keeps, per stream (`render` takes a call's new frames):

- the transformer: each layer's keys and values of the last `sliding_window - 1` frames (a
  sliding-window `DynamicCache`) and the count of frames seen, where positions go on. A frame
  attends to itself and the `sliding_window - 1` frames before it, nothing older.
- each convolution (kernel k, dilation d, stride 1): its last (k - 1) d input samples, what the
  reference's left zero padding stands in for at the utterance's start (zeros there too).
- each transposed convolution (kernel K = c s, stride s): its last c - 1 input samples (the
  upsampling ones have K = s, none; the decoder blocks' K = 2 s, one): output block j depends on
  inputs j - c + 1 .. j only. The reference trims K - s samples off both ends of its output:
  the stream drops the first K - s samples it makes, and never emits the last K - s of a call,
  which the next input completes, until that input has come.

Those right trims, chained through the decoder blocks, make the reference's decode of T frames
1920 T - 555 samples at the published rates ((((4 T 8 - 8) 5 - 5) 4 - 4) 3 - 3), not 1920 T.
The stream emits exactly those: 1920 n - 555 samples for a first call of n frames, then 1920 a
new frame. The 555 samples (23 ms) it holds back at any time are the ones the reference trims
off its right end, so the stream adds no delay of its own.

The real release's left context, per stream: 8 layers x 71 frames of keys and values (1024
wide), and in samples at each layer's own rate: 6 for each kernel-7 convolution (the ConvNeXt
blocks', the first and the last), 6, 18 and 54 for the residual units' dilations 1, 3 and 9,
and one input sample for each decoder block's transposed convolution.

The reference's `chunked_decode` is no stream to compare with: it renders each chunk again
after 25 frames of left context (the transformer alone sees 8 x 71 frames back, so that is
approximate), and each chunk's output ends 555 samples short, which the next one does not
fill: its chunks joined are 555 samples shorter per boundary than the whole decode.

MEASURED (tiny release, float32, CPU, one thread; tests/test_qwen3_omni_code2wav.py): 40 random
frames fed as a first call of 1, 3 or 8 frames, then 5 a call, joined, are the whole decode
within 2.4e-7 (its audio peaks at 0.44); renewing the transformer's cache before each call
moves them by 0.024, forgetting the convolutions' left context by 0.19, and the reference
run on each call's frames alone by 0.46. A call of 5 frames took about 10 ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn
from transformers import DynamicCache, Qwen3OmniMoeCode2Wav, Qwen3OmniMoeCode2WavDecoderBlock

from pipeline.families.kit.transformers_internals import Code2WavParts, code2wav_parts


class StreamedLayer(Protocol):
    """One streamed layer: (batch, channels, new samples) in, its new samples out."""

    def __call__(self, samples: torch.Tensor) -> torch.Tensor: ...


class LeftContext:
    """The last `context` inputs of a streamed layer, zeros at an utterance's start: what the
    reference's left padding stands in for."""

    context: int
    tail: torch.Tensor | None

    def joined(self, samples: torch.Tensor) -> torch.Tensor:
        """`samples` after the kept inputs; keeps the last `context` of them for next time."""
        if self.tail is None:
            self.tail = samples.new_zeros(samples.shape[0], samples.shape[1], self.context)
        joined = torch.cat([self.tail, samples], dim=-1)
        self.tail = joined[..., joined.shape[-1] - self.context:]
        return joined


class CausalConv(LeftContext):
    """A stride-1 convolution padded on the left only (the reference's `CausalConvNet`), fed
    piece by piece: it keeps its last (kernel - 1) * dilation inputs."""

    def __init__(self, conv: nn.Conv1d) -> None:
        if conv.stride != (1,) or conv.padding != (0,):
            raise ValueError(f"code2wav: a causal convolution of stride {conv.stride} and "
                             f"padding {conv.padding} cannot be streamed (1 and 0 expected)")
        self.conv = conv
        self.context = (conv.kernel_size[0] - 1) * conv.dilation[0]
        self.tail: torch.Tensor | None = None  # the last `context` inputs; zeros at the start

    def reset(self) -> None:
        """Forget the left context, as at an utterance's start."""
        self.tail = None

    def __call__(self, samples: torch.Tensor) -> torch.Tensor:
        if samples.shape[-1] == 0:
            return samples.new_zeros(samples.shape[0], self.conv.out_channels, 0)
        out: torch.Tensor = self.conv(self.joined(samples))
        return out


class TransposedConv(LeftContext):
    """A transposed convolution of kernel K = c * stride trimmed K - stride samples each side
    (the reference's `CausalTransConvNet`), fed piece by piece: it keeps its last c - 1
    inputs, drops the first K - stride samples of the stream and emits each call's complete
    output blocks only."""

    def __init__(self, conv: nn.ConvTranspose1d) -> None:
        kernel, stride = conv.kernel_size[0], conv.stride[0]
        if (kernel % stride or conv.padding != (0,) or conv.output_padding != (0,)
                or conv.dilation != (1,) or conv.groups != 1):
            raise ValueError(f"code2wav: a transposed convolution of kernel {kernel}, stride "
                             f"{stride} cannot be streamed (a kernel a multiple of its stride, "
                             "no padding, dilation or groups expected)")
        self.conv = conv
        self.stride = stride
        self.context = kernel // stride - 1
        self.to_drop = kernel - stride  # the reference's left trim, still to drop
        self.tail: torch.Tensor | None = None

    def reset(self) -> None:
        """Forget the left context, as at an utterance's start."""
        self.tail = None
        self.to_drop = self.conv.kernel_size[0] - self.stride

    def __call__(self, samples: torch.Tensor) -> torch.Tensor:
        if samples.shape[-1] == 0:
            return samples.new_zeros(samples.shape[0], self.conv.out_channels, 0)
        joined = self.joined(samples)
        # block j of the output (stride samples) sums inputs j - context .. j: the blocks of
        # the new inputs are complete, the partial ones after them wait for later inputs
        raw: torch.Tensor = self.conv(joined)
        out = raw[..., self.context * self.stride: joined.shape[-1] * self.stride]
        dropped = min(self.to_drop, out.shape[-1])
        self.to_drop -= dropped
        return out[..., dropped:]


class ConvNeXt:
    """The reference's `ConvNeXtBlock` streamed: its depthwise convolution keeps its context,
    the rest is pointwise in time."""

    def __init__(self, block: nn.Module) -> None:
        self.dwconv = CausalConv(_conv1d(_part(block, "dwconv")))
        self.norm, self.act = _part(block, "norm"), _part(block, "act")
        self.pwconv1, self.pwconv2 = _part(block, "pwconv1"), _part(block, "pwconv2")
        gamma = getattr(block, "gamma", None)
        if not isinstance(gamma, torch.Tensor):
            raise TypeError(f"code2wav: {type(block).__name__} has no .gamma")
        self.gamma = gamma

    def __call__(self, samples: torch.Tensor) -> torch.Tensor:
        hidden = self.dwconv(samples).permute(0, 2, 1)
        hidden = self.pwconv2(self.act(self.pwconv1(self.norm(hidden))))
        residual: torch.Tensor = (self.gamma * hidden).permute(0, 2, 1)
        return samples + residual


class ResidualUnit:
    """The reference's decoder `ResidualUnit` streamed: two causal convolutions between
    SnakeBeta activations, around a residual."""

    def __init__(self, unit: nn.Module) -> None:
        self.act1, self.act2 = _part(unit, "act1"), _part(unit, "act2")
        self.conv1 = CausalConv(_conv1d(_part(unit, "conv1")))
        self.conv2 = CausalConv(_conv1d(_part(unit, "conv2")))

    def __call__(self, samples: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.conv1(self.act1(samples))
        return self.conv2(self.act2(hidden)) + samples


class Chain:
    """Streamed layers one after another."""

    def __init__(self, layers: Sequence[StreamedLayer]) -> None:
        self.layers = list(layers)

    def __call__(self, samples: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            samples = layer(samples)
        return samples


def _part(module: nn.Module, name: str) -> nn.Module:
    """`module`'s layer `name` (as the reference names it)."""
    part = getattr(module, name, None)
    if not isinstance(part, nn.Module):
        raise TypeError(f"code2wav: {type(module).__name__} has no layer .{name}")
    return part


def _conv1d(wrapper: nn.Module) -> nn.Conv1d:
    """The torch convolution inside the reference's causal wrapper (`.conv`)."""
    conv = _part(wrapper, "conv")
    if not isinstance(conv, nn.Conv1d):
        raise TypeError(f"code2wav: {type(wrapper).__name__}.conv is no Conv1d")
    return conv


def _conv_transpose1d(wrapper: nn.Module) -> nn.ConvTranspose1d:
    """The torch transposed convolution inside the reference's causal wrapper (`.conv`)."""
    conv = _part(wrapper, "conv")
    if not isinstance(conv, nn.ConvTranspose1d):
        raise TypeError(f"code2wav: {type(wrapper).__name__}.conv is no ConvTranspose1d")
    return conv


def streamed(module: nn.Module, parts: Code2WavParts) -> StreamedLayer:
    """`module` (a layer of the reference's upsampling or decoder) as a streamed layer; a
    TypeError for a layer this renderer does not know (it could not say what context the
    layer needs)."""
    if isinstance(module, parts.causal_conv):
        return CausalConv(_conv1d(module))
    if isinstance(module, parts.transposed_conv):
        return TransposedConv(_conv_transpose1d(module))
    if isinstance(module, parts.convnext):
        return ConvNeXt(module)
    if isinstance(module, parts.residual_unit):
        return ResidualUnit(module)
    if isinstance(module, parts.snake):
        return module  # pointwise in time: nothing to keep
    if isinstance(module, Qwen3OmniMoeCode2WavDecoderBlock):
        return Chain([streamed(layer, parts) for layer in module.block])
    if isinstance(module, nn.ModuleList):
        return Chain([streamed(layer, parts) for layer in module])
    raise TypeError(f"code2wav: layer {type(module).__name__} is unknown to the streaming "
                    "renderer (pipeline/families/qwen3_omni/code2wav.py)")


def stateful_layers(layer: StreamedLayer) -> list[CausalConv | TransposedConv]:
    """Every convolution under `layer` that keeps a left context."""
    if isinstance(layer, CausalConv | TransposedConv):
        return [layer]
    if isinstance(layer, ConvNeXt):
        return [layer.dwconv]
    if isinstance(layer, ResidualUnit):
        return [layer.conv1, layer.conv2]
    if isinstance(layer, Chain):
        return [found for inner in layer.layers for found in stateful_layers(inner)]
    return []


class StreamingCode2Wav:
    """One utterance's code2wav as a stream: `render(codes)` takes the next frames (16 codes
    each) and returns all the audio they complete (see the module docstring for what is kept
    between calls). The model runs where it lies, in its own dtype; audio comes back as
    float32 on the CPU."""

    def __init__(self, model: Qwen3OmniMoeCode2Wav) -> None:
        self.model = model.eval()
        config = model.config
        self.num_quantizers = int(config.num_quantizers)
        self.codebook_size = int(config.codebook_size)
        parts = code2wav_parts()
        self.convolutions = Chain(
            [streamed(blocks, parts) for blocks in model.upsample]
            + [streamed(layer, parts) for layer in model.decoder])
        self.cache = DynamicCache(config=config)  # the transformer's keys, values, positions
        self.frames = 0  # frames rendered so far
        self.samples = 0  # samples returned so far

    def reset(self) -> None:
        """Start a new utterance: forget every kept context."""
        self.cache = DynamicCache(config=self.model.config)
        for layer in stateful_layers(self.convolutions):
            layer.reset()
        self.frames = self.samples = 0

    @property
    def device(self) -> torch.device:
        device: torch.device = self.model.code_embedding.weight.device
        return device

    @torch.inference_mode()
    def render(self, codes: torch.Tensor) -> torch.Tensor:
        """The audio (1-D float32) that `codes` (num_quantizers, frames: the next frames of
        the utterance) complete."""
        if codes.dim() != 2 or codes.shape[0] != self.num_quantizers:
            raise ValueError(f"code2wav: codes of shape (num_quantizers={self.num_quantizers}, "
                             f"frames) expected, got {tuple(codes.shape)}")
        if codes.shape[1] == 0:
            return torch.zeros(0)
        offsets = torch.arange(self.num_quantizers, device=self.device)[None, :, None]
        codes = codes.to(self.device)[None] + offsets * self.codebook_size
        hidden = self.model.code_embedding(codes).mean(1)  # (1, frames, hidden)
        hidden = self.model.pre_transformer(inputs_embeds=hidden, past_key_values=self.cache,
                                            use_cache=True).last_hidden_state
        wave = self.convolutions(hidden.permute(0, 2, 1)).clamp(min=-1, max=1)
        self.frames += codes.shape[-1]
        self.samples += wave.shape[-1]
        return wave.reshape(-1).float().cpu()
