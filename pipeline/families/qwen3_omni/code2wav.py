"""Qwen3-Omni's code2wav rendered as streams: audio for the talker's frames as they come,
several calls' streams batched in one forward.

The reference (`Qwen3OmniMoeCode2Wav.forward`) turns a whole utterance's frames (16 codes each,
one per codebook) into a waveform at once: each frame's 16 code embeddings averaged, a
transformer with causal sliding-window attention, two transposed convolutions upsampling 2x
(each followed by a ConvNeXt block), a convolution, four decoder blocks (SnakeBeta, a transposed
convolution upsampling 8, 5, 4 and 3x, three residual units of dilated convolutions), SnakeBeta,
a last convolution, and a clamp to [-1, 1]: 1920 samples a frame at 24 kHz.

Every one of those layers is causal, so no lookahead is needed: a stream that keeps each
layer's left context gives, after any T frames, exactly the reference's decode of those T
frames. A stream's context (`StreamState`, one per utterance) is:

- the transformer: each layer's keys and values of the last `sliding_window - 1` frames and the
  count of frames seen, where positions go on. A frame attends to itself and the
  `sliding_window - 1` frames before it, nothing older.
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
new frame (`Code2WavRenderer.samples_after`). The 555 samples (23 ms) it holds back at any time
are the ones the reference trims off its right end, so the stream adds no delay of its own.

The real release's left context, per stream: 8 layers x 71 frames of keys and values (1024
wide), and in samples at each layer's own rate: 6 for each kernel-7 convolution (the ConvNeXt
blocks', the first and the last), 6, 18 and 54 for the residual units' dilations 1, 3 and 9,
and one input sample for each decoder block's transposed convolution.

Batching (`Code2WavRenderer.render_batch`): the next frames of several streams, of different
counts and after different histories, run as one padded batch. Each stream's state is gathered
into the batch before the forward and scattered back after it:

- the transformer sees each row's new frames padded on the right to the batch's longest, after
  its kept keys and values padded on the left to the batch's longest history; a 4-D additive
  attention mask (`window_mask`) lets each real frame see exactly the frames it sees alone
  (its own stream's, within the window), and the rotary positions are each stream's own.
- the convolutions' left contexts are fixed-size, so they stack; each row's valid samples
  lead it (`Ragged`), the padding after them is finite values no valid sample depends on (every
  layer is causal), each row's new context is taken from its own last valid inputs, and each
  transposed convolution moves every row's complete blocks (less what it still drops at its
  stream's start) to the row's front.

The reference's `chunked_decode` is no stream to compare with: it renders each chunk again
after 25 frames of left context (the transformer alone sees 8 x 71 frames back, so that is
approximate), and each chunk's output ends 555 samples short, which the next one does not
fill: its chunks joined are 555 samples shorter per boundary than the whole decode.

MEASURED (tiny release, float32, CPU, one thread; tests/test_qwen3_omni_code2wav.py): 40 random
frames fed as a first call of 1, 3 or 8 frames, then 5 a call, joined, are the whole decode
within 4.8e-7 (its audio peaks at 0.74; 2.4e-7 at 0.44 before the release drew its talker's
experts, which moved code2wav's random weights); dropping the transformer's kept keys and values
before each call moves them by 0.058, forgetting the convolutions' left context by 0.52, and
the reference run on each call's frames alone by 0.74. Three streams rendered together in
ragged batches (calls of 0 to 8 frames, histories of 0 to 32 frames) give each stream its solo
audio within 5.1e-7 and the whole decode within 5.1e-7 (float rounding: batched kernels sum in
another order). Timings (tiny release, CPU, one thread, 12 frames of history, a shared 2-core
host): a call of 4 frames 16 ms alone; 8 streams' calls of 4 frames 60 ms batched against 117 ms
one by one, of 1 frame 28 against 76 ms; 16 streams' of 4 frames 126 against 270 ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn
from torch.nn import functional
from transformers import DynamicCache, Qwen3OmniMoeCode2Wav, Qwen3OmniMoeCode2WavDecoderBlock

from pipeline.families.kit.transformers_internals import (
    Code2WavParts,
    attention_implementation,
    code2wav_parts,
)

MASKED_ATTENTION = ("sdpa", "eager")  # attention implementations that take a 4-D float mask


class StreamedLayer(Protocol):
    """One streamed layer: (batch, channels, new samples) in, its new samples out."""

    def __call__(self, samples: torch.Tensor) -> torch.Tensor: ...


class Ragged:
    """Which samples of a padded batch are real, at the layer being run: row b's first
    `lengths[b]`; the padding after them holds finite values that no real sample depends on."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def take(self, samples: torch.Tensor, starts: Sequence[int], width: int) -> torch.Tensor:
        """samples[b, :, starts[b]: starts[b] + width] of each row b (indices past the end read
        the last sample: padding); a view where all rows start alike."""
        if len(set(starts)) == 1:  # one start for all rows: a plain slice
            return samples[..., starts[0]: starts[0] + width]
        index = torch.tensor(starts, device=samples.device)[:, None] + torch.arange(
            width, device=samples.device)
        index = index.clamp_(max=samples.shape[-1] - 1)[:, None, :]
        return samples.gather(-1, index.expand(-1, samples.shape[1], -1))


class LeftContext:
    """The last `context` inputs of each row of a streamed layer (zeros at an utterance's start:
    what the reference's left padding stands in for), set by the renderer before a call."""

    context: int
    ragged: Ragged
    tail: torch.Tensor | None  # (batch, channels, context) during a call

    def joined(self, samples: torch.Tensor) -> torch.Tensor:
        """`samples` after the kept inputs; keeps each row's last `context` real inputs."""
        if self.tail is None:
            raise RuntimeError("code2wav: a streamed layer was called without its left context "
                               "(Code2WavRenderer sets it)")
        joined = torch.cat([self.tail, samples], dim=-1)
        # a copy, not a view: a stream's context must not hold the batch's inputs alive
        self.tail = self.ragged.take(joined, self.ragged.lengths, self.context).clone()
        return joined


class CausalConv(LeftContext):
    """A stride-1 convolution padded on the left only (the reference's `CausalConvNet`), fed
    piece by piece: it keeps its last (kernel - 1) * dilation inputs."""

    def __init__(self, conv: nn.Conv1d, ragged: Ragged) -> None:
        if conv.stride != (1,) or conv.padding != (0,):
            raise ValueError(f"code2wav: a causal convolution of stride {conv.stride} and "
                             f"padding {conv.padding} cannot be streamed (1 and 0 expected)")
        self.conv = conv
        self.ragged = ragged
        self.context = (conv.kernel_size[0] - 1) * conv.dilation[0]
        self.tail = None

    def __call__(self, samples: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.conv(self.joined(samples))
        return out


class TransposedConv(LeftContext):
    """A transposed convolution of kernel K = c * stride trimmed K - stride samples each side
    (the reference's `CausalTransConvNet`), fed piece by piece: it keeps its last c - 1
    inputs, drops the first K - stride samples of each stream (`to_drop`, per row) and emits
    each call's complete output blocks only."""

    def __init__(self, conv: nn.ConvTranspose1d, ragged: Ragged) -> None:
        kernel, stride = conv.kernel_size[0], conv.stride[0]
        if (kernel % stride or conv.padding != (0,) or conv.output_padding != (0,)
                or conv.dilation != (1,) or conv.groups != 1):
            raise ValueError(f"code2wav: a transposed convolution of kernel {kernel}, stride "
                             f"{stride} cannot be streamed (a kernel a multiple of its stride, "
                             "no padding, dilation or groups expected)")
        self.conv = conv
        self.ragged = ragged
        self.stride = stride
        self.context = kernel // stride - 1
        self.initial_drop = kernel - stride  # the reference's left trim
        self.to_drop: list[int] = []  # each row's share of it still to drop, during a call
        self.tail = None

    def __call__(self, samples: torch.Tensor) -> torch.Tensor:
        lengths = self.ragged.lengths
        joined = self.joined(samples)
        # block j of the output (stride samples) sums inputs j - context .. j: the blocks of
        # a row's new inputs are complete, the partial ones after them wait for later inputs
        raw: torch.Tensor = self.conv(joined)
        dropped = [min(drop, length * self.stride)
                   for drop, length in zip(self.to_drop, lengths, strict=True)]
        emitted = [length * self.stride - drop for length, drop in zip(lengths, dropped,
                                                                       strict=True)]
        self.to_drop = [left - drop for left, drop in zip(self.to_drop, dropped, strict=True)]
        out = self.ragged.take(raw, [self.context * self.stride + drop for drop in dropped],
                               max(emitted))
        self.ragged.lengths = emitted
        return out


class ConvNeXt:
    """The reference's `ConvNeXtBlock` streamed: its depthwise convolution keeps its context,
    the rest is pointwise in time."""

    def __init__(self, block: nn.Module, ragged: Ragged) -> None:
        self.dwconv = CausalConv(_conv1d(_part(block, "dwconv")), ragged)
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

    def __init__(self, unit: nn.Module, ragged: Ragged) -> None:
        self.act1, self.act2 = _part(unit, "act1"), _part(unit, "act2")
        self.conv1 = CausalConv(_conv1d(_part(unit, "conv1")), ragged)
        self.conv2 = CausalConv(_conv1d(_part(unit, "conv2")), ragged)

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


def streamed(module: nn.Module, parts: Code2WavParts, ragged: Ragged) -> StreamedLayer:
    """`module` (a layer of the reference's upsampling or decoder) as a streamed layer over the
    batch rows `ragged` describes; a TypeError for a layer this renderer does not know (it could
    not say what context the layer needs)."""
    if isinstance(module, parts.causal_conv):
        return CausalConv(_conv1d(module), ragged)
    if isinstance(module, parts.transposed_conv):
        return TransposedConv(_conv_transpose1d(module), ragged)
    if isinstance(module, parts.convnext):
        return ConvNeXt(module, ragged)
    if isinstance(module, parts.residual_unit):
        return ResidualUnit(module, ragged)
    if isinstance(module, parts.snake):
        return module  # pointwise in time: nothing to keep
    if isinstance(module, Qwen3OmniMoeCode2WavDecoderBlock):
        return Chain([streamed(layer, parts, ragged) for layer in module.block])
    if isinstance(module, nn.ModuleList):
        return Chain([streamed(layer, parts, ragged) for layer in module])
    raise TypeError(f"code2wav: layer {type(module).__name__} is unknown to the streaming "
                    "renderer (pipeline/families/qwen3_omni/code2wav.py)")


def stateful_layers(layer: StreamedLayer) -> list[CausalConv | TransposedConv]:
    """Every convolution under `layer` that keeps a left context, in the order they run."""
    if isinstance(layer, CausalConv | TransposedConv):
        return [layer]
    if isinstance(layer, ConvNeXt):
        return [layer.dwconv]
    if isinstance(layer, ResidualUnit):
        return [layer.conv1, layer.conv2]
    if isinstance(layer, Chain):
        return [found for inner in layer.layers for found in stateful_layers(inner)]
    return []


@dataclass(eq=False)
class StreamState:
    """One stream's (utterance's) kept context between calls; empty lists are filled with an
    utterance's start (no keys, zero left contexts, the whole left trims to drop) when it is
    first rendered."""

    frames: int = 0  # frames rendered so far: the next frame's position
    samples: int = 0  # samples returned so far
    keys: list[torch.Tensor] = field(default_factory=list)  # a transformer layer's (kv heads,
    values: list[torch.Tensor] = field(default_factory=list)  # kept frames, head dim) each
    tails: list[torch.Tensor] = field(default_factory=list)  # a convolution's (channels, context)
    to_drop: list[int] = field(default_factory=list)  # a transposed convolution's left trim left


def window_mask(frames: torch.Tensor, past: int, longest: int, window: int,
                dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask (batch, 1, longest, past + longest) for a batch of streams
    whose kept keys are padded on the left to `past` and whose new frames are padded on the
    right to `longest`: row b's new frame i (position frames[b] + i) sees key j (position
    frames[b] - past + j) when that key is one of the stream's frames (position >= 0) and at
    most `window - 1` frames back."""
    keys = torch.arange(past + longest, device=frames.device)
    queries = torch.arange(longest, device=frames.device)
    back = queries[:, None] + past - keys[None, :]  # query position minus key position
    in_stream = frames[:, None] - past + keys[None, :] >= 0  # (batch, keys)
    seen = in_stream[:, None, :] & (back >= 0) & (back < window)
    mask = torch.zeros(seen.shape, dtype=dtype, device=frames.device)
    return mask.masked_fill_(~seen, torch.finfo(dtype).min)[:, None]


def _left_padded(kept: list[torch.Tensor], past: int) -> torch.Tensor:
    """Streams' kept (heads, frames, head dim) keys or values as one (batch, heads, past, head
    dim) tensor, each padded with zeros on the left (masked out)."""
    return torch.stack([functional.pad(one, (0, 0, past - one.shape[1], 0)) for one in kept])


def _cached(cache: DynamicCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache layer's keys and values (batch, heads, frames, head dim): the kept frames', then
    the new ones'."""
    entry = cache.layers[layer]
    keys, values = getattr(entry, "keys", None), getattr(entry, "values", None)
    if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise TypeError(f"code2wav: cache layer {type(entry).__name__} holds no keys and values")
    return keys, values


class Code2WavRenderer:
    """Code2wav for many streams: `render_batch(states, codes)` takes each stream's next frames
    (16 codes each) and returns all the audio they complete, in one batched forward (see the
    module docstring for what is kept between calls). The model runs where it lies, in its own
    dtype; audio comes back as float32 on the CPU. One batch at a time: the layers hold the
    batch's contexts while it runs."""

    def __init__(self, model: Qwen3OmniMoeCode2Wav) -> None:
        self.model = model.eval()
        config = model.config
        attention = attention_implementation(config)
        if attention not in MASKED_ATTENTION:
            raise ValueError(f"code2wav: attention {attention!r} takes no 4-D "
                             f"mask to batch streams with; load it with one of {MASKED_ATTENTION}")
        if set(config.layer_types) != {"sliding_attention"} or not config.sliding_window:
            raise ValueError(f"code2wav: layers {config.layer_types} (window "
                             f"{config.sliding_window}): the stream keeps a sliding window only")
        self.window = int(config.sliding_window)
        self.num_quantizers = int(config.num_quantizers)
        self.codebook_size = int(config.codebook_size)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None)
                            or config.hidden_size // config.num_attention_heads)
        self.ragged = Ragged()
        parts = code2wav_parts()
        self.convolutions = Chain(
            [streamed(blocks, parts, self.ragged) for blocks in model.upsample]
            + [streamed(layer, parts, self.ragged) for layer in model.decoder])
        self.stateful = stateful_layers(self.convolutions)
        self.transposed = [layer for layer in self.stateful if isinstance(layer, TransposedConv)]

    @property
    def device(self) -> torch.device:
        device: torch.device = self.model.code_embedding.weight.device
        return device

    @property
    def dtype(self) -> torch.dtype:
        dtype: torch.dtype = self.model.code_embedding.weight.dtype
        return dtype

    def samples_after(self, frames: int) -> int:
        """The samples a stream has returned once it has rendered `frames` frames (the
        reference's decode of them): 1920 frames - 555 at the published rates, 0 for none."""
        samples = frames
        for layer in self.transposed:
            samples = max(0, samples * layer.stride - layer.initial_drop)
        return samples

    def check(self, codes: torch.Tensor) -> None:
        """ValueError unless `codes` is (num_quantizers, frames) of codes in the codebooks."""
        if codes.dim() != 2 or codes.shape[0] != self.num_quantizers:
            raise ValueError(f"code2wav: codes of shape (num_quantizers={self.num_quantizers}, "
                             f"frames) expected, got {tuple(codes.shape)}")
        if codes.is_floating_point() or codes.is_complex():
            raise ValueError(f"code2wav: integer codes expected, got {codes.dtype}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise ValueError(f"code2wav: codes from 0 to {self.codebook_size - 1} expected, got "
                             f"{int(codes.min())} to {int(codes.max())}")

    @torch.inference_mode()
    def render_batch(self, states: Sequence[StreamState], codes: Sequence[torch.Tensor]
                     ) -> list[torch.Tensor]:
        """Each stream's audio (1-D float32) that its `codes` (num_quantizers, frames: its next
        frames) complete, the streams rendered together; each state advanced. A stream without
        frames gets no audio (and is left out of the forward)."""
        if len(states) != len(codes):
            raise ValueError(f"code2wav: {len(states)} streams, {len(codes)} code tensors")
        if len({id(state) for state in states}) != len(states):
            raise ValueError("code2wav: a stream twice in one batch (its calls follow each other)")
        for one in codes:
            self.check(one)
        waves = [torch.zeros(0) for _ in states]
        live = [index for index, one in enumerate(codes) if one.shape[1]]
        if live:
            rendered = self._render([states[index] for index in live],
                                    [codes[index] for index in live])
            for index, wave in zip(live, rendered, strict=True):
                waves[index] = wave
        return waves

    def _render(self, states: list[StreamState], codes: list[torch.Tensor]
                ) -> list[torch.Tensor]:
        for state in states:
            self._open(state)
        hidden = self._transform(states, codes)
        self.ragged.lengths = [one.shape[1] for one in codes]
        for index, layer in enumerate(self.stateful):
            layer.tail = torch.stack([state.tails[index] for state in states])
        for index, layer in enumerate(self.transposed):
            layer.to_drop = [state.to_drop[index] for state in states]
        wave = self.convolutions(hidden.permute(0, 2, 1)).clamp(min=-1, max=1)
        self._scatter_contexts(states)
        batch = wave[:, 0].float().cpu()
        waves = [batch[row, :length] for row, length in enumerate(self.ragged.lengths)]
        for state, one, audio in zip(states, codes, waves, strict=True):
            state.frames += one.shape[1]
            state.samples += audio.shape[0]
        return waves

    def _open(self, state: StreamState) -> None:
        """Fill a stream's empty context with an utterance's start."""
        if not state.keys:
            empty = torch.zeros(self.kv_heads, 0, self.head_dim, dtype=self.dtype,
                                device=self.device)
            layers = len(self.model.pre_transformer.layers)
            state.keys, state.values = [empty] * layers, [empty] * layers
        if not state.tails:
            state.tails = [torch.zeros(layer.conv.in_channels, layer.context, dtype=self.dtype,
                                       device=self.device) for layer in self.stateful]
        if not state.to_drop:
            state.to_drop = [layer.initial_drop for layer in self.transposed]

    def _scatter_contexts(self, states: list[StreamState]) -> None:
        """Each stream's new convolution contexts, from the batch's (the layers let go)."""
        for index, layer in enumerate(self.stateful):
            if layer.tail is None:
                raise RuntimeError("code2wav: a streamed layer lost its left context")
            for state, tail in zip(states, layer.tail.unbind(0), strict=True):
                state.tails[index] = tail
            layer.tail = None
        for index, transposed in enumerate(self.transposed):
            for state, left in zip(states, transposed.to_drop, strict=True):
                state.to_drop[index] = left

    def _transform(self, states: list[StreamState], codes: list[torch.Tensor]) -> torch.Tensor:
        """The transformer's states (batch, longest, hidden) for the streams' new frames (row
        b's first frames[b] real), each stream's kept keys and values advanced."""
        lengths = [one.shape[1] for one in codes]
        longest = max(lengths)
        padded = torch.zeros(len(codes), self.num_quantizers, longest, dtype=torch.long)
        for row, one in enumerate(codes):
            padded[row, :, : one.shape[1]] = one
        offsets = torch.arange(self.num_quantizers, device=self.device)[None, :, None]
        hidden = self.model.code_embedding(padded.to(self.device) + offsets * self.codebook_size)
        kept = [state.keys[0].shape[1] for state in states]
        past = max(kept)
        cache = DynamicCache()
        for layer in range(len(states[0].keys)):
            cache.update(_left_padded([state.keys[layer] for state in states], past),
                         _left_padded([state.values[layer] for state in states], past), layer)
        frames = torch.tensor([state.frames for state in states], device=self.device)
        mask = window_mask(frames, past, longest, self.window, self.dtype)
        out = self.model.pre_transformer(
            inputs_embeds=hidden.mean(1), past_key_values=cache, use_cache=True,
            position_ids=frames[:, None] + torch.arange(longest, device=self.device),
            attention_mask={"full_attention": mask, "sliding_attention": mask})
        for layer in range(len(cache.layers)):
            keys, values = _cached(cache, layer)
            for row, state in enumerate(states):
                end = past + lengths[row]
                start = end - min(kept[row] + lengths[row], self.window - 1)
                state.keys[layer] = keys[row, :, start:end].clone()
                state.values[layer] = values[row, :, start:end].clone()
        states_out: torch.Tensor = out.last_hidden_state
        return states_out


class StreamingCode2Wav:
    """One utterance's code2wav as a stream: `render(codes)` takes the next frames (16 codes
    each) and returns all the audio they complete (`Code2WavRenderer` with one stream)."""

    def __init__(self, model: Qwen3OmniMoeCode2Wav) -> None:
        self.renderer = Code2WavRenderer(model)
        self.stream = StreamState()

    def reset(self) -> None:
        """Start a new utterance: forget every kept context."""
        self.stream = StreamState()

    @property
    def frames(self) -> int:
        """Frames rendered so far."""
        return self.stream.frames

    @property
    def samples(self) -> int:
        """Samples returned so far."""
        return self.stream.samples

    def render(self, codes: torch.Tensor) -> torch.Tensor:
        """The audio (1-D float32) that `codes` (num_quantizers, frames: the next frames of
        the utterance) complete."""
        return self.renderer.render_batch([self.stream], [codes])[0]
