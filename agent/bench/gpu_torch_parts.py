"""The Thinker worker's torch parts, timed as the Thinker runs them (`omnivox bench gpu-torch`):
Qwen2.5-Omni's audio tower and the hidden-state model (the thinker LM's torch copy whose rows
the Talker reads).

The audio tower is the family's `AudioTower`: Whisper log-mel features on the CPU, the encoder
on the device; timed per caller utterance of 1, 2 and 8 s. The hidden-state model is the
family's `ThinkerStates` over a Qwen2 at the thinker's widths: a prompt of N rows, then reply
steps of one token for each level of concurrent requests, batched as the Thinker batches them
(`step_many`: one KV cache per request, the norms and MLP run once for all). At real size it
has all 28 layers where their weights take at most half the device's free memory (a GPU),
else 2 (the JSON says which).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from agent.bench.gpu_torch_kit import (
    REPEATS,
    UTTERANCE_S,
    Target,
    dtype_name,
    figure,
    median_s,
    on_device,
    parameters,
    qwen2_config,
    thinker_config,
    timed,
    weight_gib,
)
from pipeline.families.kit.transformers_internals import audio_encoder_class, model_from_config

PROMPT_ROWS = (64, 512)
AUDIO_ROWS = 25  # the prompt rows holding audio features: a 1 s utterance's
REPLY_STEPS = 16
CUT_LAYERS = 2


def audio_tower_part(target: Target) -> dict[str, Any]:
    """The audio tower's milliseconds per utterance and per second of caller audio."""
    from transformers import WhisperFeatureExtractor
    Qwen2_5OmniAudioEncoder = audio_encoder_class()

    from pipeline.families.kit.torch_placement import Placement
    from pipeline.families.qwen25_omni.audio_tower import AudioTower

    config = thinker_config(target.size).audio_config
    encoder = on_device(
        lambda: model_from_config(Qwen2_5OmniAudioEncoder, config, dtype=target.dtype),
        target.device, target.dtype)
    tower = AudioTower(WhisperFeatureExtractor(feature_size=config.num_mel_bins), encoder,
                       Placement(target.device, target.dtype))
    rows = []
    for seconds in UTTERANCE_S:
        audio = caller_audio(seconds)
        ms = 1000 * median_s(partial(tower.encode, audio), target.device, REPEATS)
        rows.append({"audio_s": seconds, "ms": figure(ms), "ms_per_audio_s": figure(ms / seconds)})
    return {"parameters": parameters(encoder), "weight_gib": figure(weight_gib(encoder)),
            "dtype": dtype_name(target.dtype), "utterances": rows}


def caller_audio(seconds: float, rate: int = 16000) -> np.ndarray:
    """Caller audio, int16 at 16 kHz: noise (the tower's cost is the audio's length alone)."""
    return np.random.default_rng(0).integers(-8000, 8000, int(rate * seconds), dtype=np.int16)


def thinker_states_part(target: Target, levels: list[int]) -> dict[str, Any]:
    """The hidden-state model's milliseconds per prompt of N rows, and per reply step of 1, 16
    and 64 concurrent requests batched (`step_many`, as the Thinker's `BatchedSteps` runs
    them), with the milliseconds per request."""
    from transformers import Qwen2Model

    from pipeline.families.qwen25_omni.thinker_states import ThinkerStates, step_many

    text = thinker_config(target.size).text_config
    layers = states_layers(target, text)
    config = qwen2_config(text, layers)
    model = on_device(lambda: model_from_config(Qwen2Model, config, dtype=target.dtype),
                      target.device, target.dtype)
    states = ThinkerStates(model)
    prompts = []
    for rows in PROMPT_ROWS:
        prompt = thinker_prompt(rows, text.hidden_size)
        ms = 1000 * median_s(partial(states.open, prompt), target.device, REPEATS)
        prompts.append({"rows": rows, "ms": figure(ms)})
    batched = []
    for requests in levels:
        replies = [states.open(thinker_prompt(PROMPT_ROWS[0], text.hidden_size))[0]
                   for _ in range(requests)]
        step = partial(step_many, [(reply, [7]) for reply in replies])
        steps = [timed(step, target.device) for _ in range(REPLY_STEPS + 1)][1:]
        ms = 1000 * float(np.median(steps))
        batched.append({"requests": requests, "step_ms_p50": figure(ms),
                        "ms_per_request": figure(ms / requests)})
    return {"parameters": parameters(model), "weight_gib": figure(weight_gib(model)),
            "dtype": dtype_name(target.dtype), "layers": layers,
            "layers_cut": layers < text.num_hidden_layers, "prompts": prompts,
            "batched_steps": batched}


def states_layers(target: Target, text: Any) -> int:
    """All the thinker's layers where their weights fit in half the device's free memory (a
    GPU at real size; tiny always), else CUT_LAYERS."""
    if target.size == "tiny":
        return int(text.num_hidden_layers)
    if not target.cuda:
        return CUT_LAYERS
    from transformers import Qwen2Model

    meta = on_device(lambda: Qwen2Model(qwen2_config(text, text.num_hidden_layers)),
                     torch.device("meta"))
    need = parameters(meta) * torch.tensor([], dtype=target.dtype).element_size()
    free, _ = torch.cuda.mem_get_info(target.device)
    return int(text.num_hidden_layers) if need < free / 2 else CUT_LAYERS


@dataclass(frozen=True)
class Prompt:
    """What `ThinkerStates.open` reads of a Thinker's prompt (`kit.audio_prompt.ThinkerPrompt`,
    which the check does not import: its module imports the server's stage messages)."""

    ids: list[int]
    embeds: torch.Tensor  # (len(ids), hidden)
    audio_rows: torch.Tensor  # (len(ids),) bool

    def __len__(self) -> int:
        return len(self.ids)


def thinker_prompt(rows: int, hidden: int) -> Any:
    """A prompt of `rows` random embedding rows, the first AUDIO_ROWS of them audio (a
    `Prompt`, which `ThinkerStates.open` reads as it reads a `ThinkerPrompt`)."""
    audio = torch.zeros(rows, dtype=torch.bool)
    audio[:AUDIO_ROWS] = True
    return Prompt(list(range(rows)), torch.randn(rows, hidden) * 0.02, audio)
