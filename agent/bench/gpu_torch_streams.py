"""The two vocoders under concurrent streams, as their VoiceBox stages render them
(`omnivox bench gpu-torch`): Qwen2.5-Omni's token2wav and Orpheus's SNAC.

Each stream is one reply: its tokens cut into the windows its VoiceBox renders (token2wav: the
cascade's groups of 4 then 16 tokens, each window with the turn's earlier tokens as context
and one DiT block of lookahead, as `OmniVoiceBox` plans them; SNAC: `WindowCutter`'s windows
of whole frames). All streams start together with every token already there (no Talker): round
r hands on every stream's r-th window, and the windows of a round are rendered in batches of
the VoiceBox's `max_batch` (16), in stream order, as its queue hands them on. So the figures
are the vocoder's alone: time to a stream's first window (the batch holding its first voiced
window done), and the real-time factor, audio seconds rendered per wall second, per stream and
in total.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from agent.bench.gpu_torch_kit import (
    Target,
    dtype_name,
    figure,
    on_device,
    parameters,
    synchronize,
    weight_gib,
)
from pipeline.families.kit.transformers_internals import model_from_config

W = TypeVar("W")
MAX_BATCH = 16  # both VoiceBoxes' default max_batch
FIRST_GROUP, GROUP = 4, 16  # the cascade's speech tokens per group (pipeline/settings.py)
REFERENCE_MEL_FRAMES = 300  # a speaker's reference mel (spk_dict.pt's ref_mel), random here
TOKEN2WAV_TOKENS = {"real": 100, "tiny": 36}  # per reply: 2.0 s, 0.72 s of audio (50 a second)
SNAC_FRAMES = {"real": 24, "tiny": 8}  # per reply: 2.05 s, 0.68 s (2048 samples a frame)
NUM_STEPS = {"real": 10, "tiny": 5}  # ODE steps: the reference's; omni-tiny's
SAMPLE_RATE = 24000  # token2wav's output (the qwen25_omni VoiceBox's)


@dataclass(frozen=True)
class StreamRun:
    """One level's timings: each stream's first window, the whole wall time, each batch's."""

    first_window_s: list[float]
    wall_s: float
    batch_s: list[float]


def run_rounds(streams: Sequence[Sequence[W]], render: Callable[[list[W]], object],
               voices: Callable[[W], bool], device: torch.device) -> StreamRun:
    """Render every stream's windows round by round, in batches of MAX_BATCH (see the module's
    docstring); a stream's first window counts when the batch with its first voiced one ends."""
    first: list[float | None] = [None] * len(streams)
    batches = []
    synchronize(device)
    began = time.perf_counter()
    for r in range(max(len(windows) for windows in streams)):
        jobs = [(i, windows[r]) for i, windows in enumerate(streams) if r < len(windows)]
        for at in range(0, len(jobs), MAX_BATCH):
            batch = jobs[at: at + MAX_BATCH]
            if not any(voices(window) for _, window in batch):
                continue  # nothing to voice yet (a group inside the lookahead): no forward
            started = time.perf_counter()
            render([window for _, window in batch])
            synchronize(device)
            ended = time.perf_counter()
            batches.append(ended - started)
            for i, window in batch:
                if first[i] is None and voices(window):
                    first[i] = ended - began
    wall = time.perf_counter() - began
    return StreamRun([wall if f is None else f for f in first], wall, batches)


def level_figures(run: StreamRun, audio_s: float) -> dict[str, Any]:
    """One level's figures: first window p50 and max, wall time, real-time factors, batches."""
    streams = len(run.first_window_s)
    return {"streams": streams, "first_window_p50_s": figure(statistics.median(run.first_window_s)),
            "first_window_max_s": figure(max(run.first_window_s)), "wall_s": figure(run.wall_s),
            "audio_s_per_stream": figure(audio_s),
            "rtf_per_stream": figure(audio_s / run.wall_s),
            "rtf_total": figure(streams * audio_s / run.wall_s),
            "render_calls": len(run.batch_s),
            "render_ms_p50": figure(1000 * statistics.median(run.batch_s))}


# ---- token2wav ----


def token2wav_part(target: Target, levels: Sequence[int], also_float32: bool) -> dict[str, Any]:
    """token2wav at `target`: each level of concurrent streams (and the first level again in
    float32 when asked: the VoiceBox's dtype today)."""
    from transformers import Qwen2_5OmniToken2WavModel

    from agent.bench.gpu_torch_kit import omni_config
    from pipeline.families.qwen25_omni.token2wav_window import (
        CONTEXT_TOKENS,
        SamplerSettings,
        WindowRenderer,
    )

    config: Any = omni_config(target.size).token2wav_config
    model = on_device(
        lambda: model_from_config(Qwen2_5OmniToken2WavModel, config, dtype=target.dtype),
        target.device, target.dtype)
    renderer = WindowRenderer(model, settings=SamplerSettings(num_steps=NUM_STEPS[target.size]))
    row: dict[str, Any] = {
        "parameters": parameters(model), "parameters_dit": parameters(model.code2wav_dit_model),
        "parameters_bigvgan": parameters(model.code2wav_bigvgan_model),
        "weight_gib": figure(weight_gib(model)), "dtype": dtype_name(target.dtype),
        "num_steps": renderer.settings.num_steps, "context_tokens": CONTEXT_TOKENS,
        "lookahead_tokens": renderer.block_tokens, "tokens_per_stream": TOKEN2WAV_TOKENS[
            target.size]}
    row["levels"] = [_token2wav_level(renderer, n, target) for n in [1, *levels]][1:]  # warm-up
    if also_float32 and target.dtype != torch.float32:
        renderer.model.float()
        row["float32_levels"] = [_token2wav_level(renderer, n, target) for n in [1, levels[0]]][1:]
    return row


def _token2wav_level(renderer: Any, streams: int, target: Target) -> dict[str, Any]:
    """`streams` replies at once through `renderer` (a WindowRenderer)."""
    from pipeline.families.qwen25_omni.token2wav_window import Speaker

    dit = renderer.dit.config
    speaker = Speaker(torch.randn(1, dit.enc_emb_dim),
                      torch.randn(1, REFERENCE_MEL_FRAMES, dit.mel_dim))
    count = TOKEN2WAV_TOKENS[target.size]
    replies = [turn_windows(renderer, torch.randint(0, dit.num_embeds - 1, (count,)).tolist())
               for _ in range(streams)]
    run = run_rounds(replies, lambda batch: renderer.render(batch, [speaker] * len(batch)),
                     lambda window: window.new_tokens > 0, target.device)
    return level_figures(run, count * renderer.samples_per_token / SAMPLE_RATE)


def turn_windows(renderer: Any, tokens: list[int]) -> list[Any]:
    """The windows `OmniVoiceBox` renders for one reply handed on in the cascade's groups, by
    its own `TurnTokens`: each group's job voices what it can but the last `block_tokens` (its
    lookahead), the closing job the rest."""
    from pipeline.families.qwen25_omni.token2wav_window import CONTEXT_TOKENS, TurnTokens

    turn, lookahead = TurnTokens(), renderer.block_tokens
    starts = [0, *range(FIRST_GROUP, len(tokens), GROUP)]  # each group's first token
    windows = [turn.window(renderer, tokens[start:end], True, CONTEXT_TOKENS, lookahead)
               for start, end in zip(starts, [*starts[1:], len(tokens)], strict=True)]
    windows.append(turn.window(renderer, [], False, CONTEXT_TOKENS, lookahead))  # closing job
    return windows


# ---- SNAC ----


def snac_part(target: Target, levels: Sequence[int]) -> dict[str, Any]:
    """SNAC 24 kHz in float32 (the VoiceBox's dtype) at each level of concurrent streams."""
    from snac import SNAC

    from agent.bench.gpu_torch_kit import snac_config
    from pipeline.families.orpheus.snac_decoder import SnacDecoder

    config = snac_config(target.size)
    decoder = SnacDecoder(on_device(lambda: SNAC(**config), target.device), str(target.device))
    row: dict[str, Any] = {"parameters": parameters(decoder.model),
                           "weight_gib": figure(weight_gib(decoder.model)), "dtype": "float32",
                           "frames_per_stream": SNAC_FRAMES[target.size]}
    row["levels"] = [_snac_level(decoder, n, target) for n in [1, *levels]][1:]  # warm-up
    return row


def _snac_level(decoder: Any, streams: int, target: Target) -> dict[str, Any]:
    """`streams` replies at once through `decoder` (a SnacDecoder)."""
    from pipeline.families.orpheus.codes import FRAME
    from pipeline.families.orpheus.windows import WindowCutter

    frames = SNAC_FRAMES[target.size]
    replies = []
    for _ in range(streams):
        cutter = WindowCutter(group=GROUP // FRAME, first=max(1, FIRST_GROUP // FRAME))
        codes = torch.randint(0, 4096, (frames, FRAME)).tolist()
        windows = [w for frame in codes for w in cutter.add([frame])]
        replies.append(windows + cutter.finish())
    run = run_rounds(replies, decoder.render, lambda window: window.voiced > 0, target.device)
    return level_figures(run, frames * decoder.samples_per_frame / decoder.sample_rate)
