"""Qwen2.5-Omni's token2wav rendered in windows as speech tokens arrive.

The reference (`Qwen2_5OmniToken2WavModel.forward`) turns a whole utterance's codec tokens into
a waveform at once: a flow-matching DiT integrates mel frames (`repeats` per token) from Gaussian
noise with classifier-free guidance over `num_steps` RK4 steps, then BigVGAN vocodes them
(`hop` samples per frame). A reply's tokens arrive in groups, so each group is rendered as a
window: the group's tokens after some left context of the turn's earlier tokens, keeping only
the group's samples. Three things make a window agree with one full decode:

- The initial noise is one fixed sequence indexed by absolute mel frame (`NoiseTable`), so a
  frame starts from the same noise in every window that holds it, as in the full decode (the
  reference draws `torch.randn` per call instead).
- A window starts on a DiT attention block boundary (absolute frame a multiple of
  `block_size`): the DiT attends within blocks (one more back or ahead in a few layers), so an
  aligned window partitions its frames exactly as the full decode does.
- The left context covers what the new frames see across the ODE's evaluations. The right edge
  has no future tokens: the full decode's look-ahead layers see up to one block ahead there.

Windows of concurrent turns are sampled in one batched DiT forward per ODE evaluation, padded to
the longest; the reference has no key padding mask, so `_masked_padding` hides padded frames
from real ones (each padded frame attends to itself only, keeping its row finite). BigVGAN, a
small share of the work, runs per window so that no padding reaches its convolutions.

MEASURED (CPU, one torch thread on a shared 2-core machine; the tiny release's token2wav,
random weights; its BigVGAN at 64 initial channels; 10 ODE steps, guidance 0.5; a 120-token
turn rendered in groups of 4 then 16 tokens as the cascade hands them on; differences of the
joined windows from one full decode, relative to the full decode's RMS; time per later window):

    context  lookahead   max diff   RMS diff   ms/window
       0         0       3.06       0.317       351
      24         0       3.06       0.238       502
      48         0       3.06       0.238       607
       0        12       2.98       0.210       371
      12        12       4.0e-6     3.9e-7      406
      24         6       3.5e-4     1.5e-5      505
      24        12       4.5e-6     3.8e-7      578
      48        12       4.1e-6     3.7e-7      705
      24        24       2.1e-6     2.7e-7      597

So a window needs both: one block (12 tokens) of left context and one of lookahead make it the
full decode to float rounding; either missing leaves errors as large as the signal at the
window's edges. Chosen: CONTEXT_TOKENS = 24 (two blocks: the real DiT looks back two blocks per
evaluation, in two layers, where the tiny one looks back one) and LOOKAHEAD_TOKENS = 12.
With random weights the DiT's output depends on its input state only weakly, so the context
a trained model needs (its state carries across blocks over the 36 evaluations) may be larger:
measure again with real weights. One full decode of the 120 tokens took 1.0 s; two windows
took 995 ms in one batch, 1110 ms one at a time. A window batched with a longer one is the
same window rendered alone within 2.0e-6 of its RMS (3.0e-5 without the padding mask). The
tiny token2wav renders about 2x slower than real time on one thread here (a 16-token group is
320 ms of audio).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from transformers import Qwen2_5OmniToken2WavDiTModel, Qwen2_5OmniToken2WavModel

from pipeline.families.kit.transformers_internals import (
    BlockDiff,
    block_diff_replaced,
    ode_solver_class,
)

CONTEXT_TOKENS = 24  # left context per window, two DiT blocks (chosen from MEASURED)
LOOKAHEAD_TOKENS = 12  # later tokens per window, one DiT block (chosen from MEASURED)
NOISE_SEED = 20250101
NOISE_FRAMES = 32768  # the noise sequence's length; absolute frames wrap around it
FAR = 1 << 20  # a block distance no layer attends across (masks a padded key)


@dataclass(frozen=True)
class SamplerSettings:
    """The reference's sampling arguments (its defaults)."""

    num_steps: int = 10
    guidance_scale: float = 0.5
    sway_coefficient: float = -1.0


@dataclass(frozen=True)
class Speaker:
    """A voice's conditioning: the x-vector (1, enc_emb_dim) and reference mel (1, T, mel_dim)."""

    conditioning: torch.Tensor
    reference_mel: torch.Tensor


@dataclass(frozen=True)
class Window:
    """Tokens to render and which of them are new: `tokens[keep_from:len - lookahead]`, whose
    first is the turn's token number `start + keep_from`; context before, lookahead after."""

    tokens: tuple[int, ...]
    start: int  # the turn's token index of tokens[0]
    keep_from: int
    lookahead: int = 0  # later tokens rendered only for the new ones' sake

    @property
    def new_tokens(self) -> int:
        return len(self.tokens) - self.keep_from - self.lookahead


def plan_window(history: Sequence[int], offset: int, new: Sequence[int], context: int,
                block_tokens: int, future: Sequence[int] = ()) -> Window:
    """The window rendering `new` after a turn's earlier tokens, with `future` (tokens after
    `new`, when known) as lookahead.

    `history` holds the turn's latest earlier tokens, `offset` the turn index of its first.
    The window starts at least `context` tokens before `new`, on a block boundary (a turn
    index that is a multiple of `block_tokens`), but never before `offset`: a history shorter
    than `context + block_tokens` may give a shorter, unaligned context.
    """
    end = offset + len(history)
    start = max(offset, (max(0, end - context) // block_tokens) * block_tokens)
    kept = tuple(history[start - offset:])
    return Window(kept + tuple(new) + tuple(future), start, len(kept), len(future))


class NoiseTable:
    """One fixed noise sequence, (frames, mel_dim), indexed by absolute mel frame (wrapping)."""

    def __init__(self, mel_dim: int, frames: int = NOISE_FRAMES, seed: int = NOISE_SEED) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.table = torch.randn(frames, mel_dim, generator=generator)

    def frames(self, first: int, count: int) -> torch.Tensor:
        """Noise for absolute frames first .. first + count - 1."""
        index = torch.arange(first, first + count) % self.table.shape[0]
        return self.table[index]


class WindowRenderer:
    """Renders windows of a token2wav model, batched, into float32 PCM. The model runs where it
    lies, in its own dtype (the VoiceBox loads it in float32 on the CPU, as the reference runs
    it; `omnivox bench gpu-torch` builds it in bfloat16 on a GPU)."""

    def __init__(self, model: Qwen2_5OmniToken2WavModel, noise: NoiseTable | None = None,
                 settings: SamplerSettings | None = None) -> None:
        self.model = model.eval()
        self.dit: Qwen2_5OmniToken2WavDiTModel = model.code2wav_dit_model
        dit_config = self.dit.config
        if dit_config.block_size % dit_config.repeats:
            raise ValueError("token2wav: block_size must be a whole number of tokens")
        self.repeats = int(dit_config.repeats)
        self.block_tokens = int(dit_config.block_size) // self.repeats
        self.hop: int = math.prod(model.code2wav_bigvgan_model.config.upsample_rates)
        self.noise = noise or NoiseTable(int(dit_config.mel_dim))
        self.settings = settings or SamplerSettings()

    @property
    def samples_per_token(self) -> int:
        return self.repeats * self.hop

    def plan(self, history: Sequence[int], offset: int, new: Sequence[int],
             context: int = CONTEXT_TOKENS, future: Sequence[int] = ()) -> Window:
        """The window for `new` after the turn's `history` (see `plan_window`)."""
        return plan_window(history, offset, new, context, self.block_tokens, future)

    @torch.inference_mode()
    def render(self, windows: Sequence[Window], speakers: Sequence[Speaker]) -> list[torch.Tensor]:
        """Each window's new samples (1-D float32, `samples_per_token` per new token).

        Windows whose speakers' reference mels differ in length go in separate DiT batches:
        the speaker encoder pools the whole reference mel, with no mask for padding."""
        step = self.samples_per_token
        waves = [torch.zeros(0) for _ in windows]
        for rows in _by_reference_length(windows, speakers):
            mels = self.sample_mels([windows[row] for row in rows], [speakers[row] for row in rows])
            for row, mel in zip(rows, mels, strict=True):
                wave = self.model.code2wav_bigvgan_model(mel[None]).reshape(-1).float()
                first = windows[row].keep_from * step
                waves[row] = wave[first: first + windows[row].new_tokens * step]
        return waves

    def sample_mels(self, windows: Sequence[Window], speakers: Sequence[Speaker]
                    ) -> list[torch.Tensor]:
        """Each window's mel frames (mel_dim, frames): the reference's `sample`, batched, from
        the noise table's frames instead of fresh noise."""
        frames = [len(window.tokens) * self.repeats for window in windows]
        longest = max(frames)
        codes = torch.zeros(len(windows), longest // self.repeats, dtype=torch.long)
        noise = torch.zeros(len(windows), longest, self.dit.mel_dim)
        for row, window in enumerate(windows):
            codes[row, : len(window.tokens)] = torch.tensor(window.tokens, dtype=torch.long)
            noise[row, : frames[row]] = self.noise.frames(window.start * self.repeats, frames[row])
        device, dtype = self.dit.device, self.dit.dtype  # inputs made on the CPU go there
        conditioning = torch.cat([s.conditioning for s in speakers]).to(device, dtype)
        reference_mel = torch.cat([s.reference_mel for s in speakers]).to(device, dtype)
        with _masked_padding(self.dit, frames, longest):
            mel = sample(self.dit, noise.to(device, dtype), conditioning, reference_mel,
                         codes.to(device), self.settings)
        return [mel[row, :, :count] for row, count in enumerate(frames)]


def sample(dit: Qwen2_5OmniToken2WavDiTModel, noise: torch.Tensor, conditioning: torch.Tensor,
           reference_mel: torch.Tensor, codes: torch.Tensor, settings: SamplerSettings
           ) -> torch.Tensor:
    """Mel frames (batch, mel_dim, frames) for `codes`: the reference's `sample` step for step,
    starting from `noise` (batch, frames, mel_dim) instead of drawing it."""
    frames = noise.shape[1]
    if frames > dit.config.max_position_embeddings:
        raise ValueError(f"token2wav window of {frames} mel frames exceeds the DiT's "
                         f"{dit.config.max_position_embeddings}")
    speaker = conditioning.unsqueeze(1).repeat(1, frames, 1)
    guidance = settings.guidance_scale

    def velocity(time_step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        guided_too = guidance >= 1e-5  # the reference's test for guidance
        out: torch.Tensor = dit(hidden_states=state, speaker_embedding=speaker,
                                condition_vector=reference_mel, quantized_code=codes,
                                time_step=time_step, apply_cfg=guided_too)
        if not guided_too:
            return out
        guided, null = torch.chunk(out, 2, dim=0)
        return guided + (guided - null) * guidance

    times = torch.linspace(0, 1, settings.num_steps, dtype=conditioning.dtype,
                           device=conditioning.device)
    if settings.sway_coefficient is not None:
        times += settings.sway_coefficient * (torch.cos(torch.pi / 2 * times) - 1 + times)
    solver = ode_solver_class()(function=velocity, initial_value=noise)
    trajectory = solver.integrate(times)
    final: torch.Tensor = trajectory[-1]
    return final.permute(0, 2, 1)


def _by_reference_length(windows: Sequence[Window], speakers: Sequence[Speaker]
                         ) -> list[list[int]]:
    """The rows of windows with new tokens, grouped by their speaker's reference mel length."""
    groups: dict[int, list[int]] = {}
    for row, (window, speaker) in enumerate(zip(windows, speakers, strict=True)):
        if window.new_tokens:
            groups.setdefault(speaker.reference_mel.shape[1], []).append(row)
    return list(groups.values())


@contextlib.contextmanager
def _masked_padding(dit: Qwen2_5OmniToken2WavDiTModel, frames: Sequence[int],
                    longest: int) -> Iterator[None]:
    """Hide each row's padded frames from its real ones inside the DiT's attention.

    The DiT builds every layer's attention mask from one block-distance matrix
    (`_create_block_diff`, replaced through `kit/transformers_internals.py`); a distance of
    FAR is outside every layer's reach, so setting it for padded keys masks them. A padded
    query keeps its own key (distance 0), so no row of the softmax is empty (an empty row is
    NaN, and NaN times a zero weight spreads).
    """
    if all(count == longest for count in frames):
        yield
        return
    padded = torch.arange(longest)[None, :] >= torch.tensor(frames)[:, None]  # (batch, key)

    def masking(plain: BlockDiff) -> BlockDiff:
        def masked(hidden_states: torch.Tensor) -> torch.Tensor:
            # (rows, heads, query, key), the rows being the batch twice over (guidance)
            diff = plain(hidden_states)  # expanded: masked_fill makes the copy
            rows = diff.shape[0] // len(frames)
            own = torch.eye(longest, dtype=torch.bool, device=diff.device)
            hide = padded.to(diff.device).repeat(rows, 1)[:, None, None, :] & ~own
            return diff.masked_fill(hide, FAR)

        return masked

    with block_diff_replaced(dit, masking):
        yield


@dataclass
class TurnTokens:
    """One turn's tokens as far as its windows need them: the latest `tokens`, the first of
    which is the turn's token number `offset`, and how many of the turn's tokens are voiced."""

    tokens: list[int] = field(default_factory=list)
    offset: int = 0
    voiced: int = 0

    def window(self, renderer: WindowRenderer, new: list[int], more: bool, context: int,
               lookahead: int) -> Window:
        """Take the job's tokens; the window voicing all not yet voiced, but for the last
        `lookahead` when `more` of the turn follows. Keeps what later windows need."""
        self.tokens += new
        end = self.offset + len(self.tokens)
        upto = max(self.voiced, end - lookahead) if more else end
        at = self.voiced - self.offset
        window = renderer.plan(self.tokens[:at], self.offset,
                               self.tokens[at: upto - self.offset], context,
                               self.tokens[upto - self.offset:])
        self.voiced = upto
        drop = max(0, self.voiced - context - renderer.block_tokens - self.offset)
        del self.tokens[:drop]
        self.offset += drop
        return window
