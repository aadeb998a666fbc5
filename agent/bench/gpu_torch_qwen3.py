"""Qwen3-Omni's torch-side parts, timed as its stages run them (`omnivox bench gpu-torch`).

Real size is Qwen3-Omni-30B-A3B's published configuration (`qwen3_omni.real_size`), tiny the
family's tiny one; random weights built on the device as the stages load theirs (each part in
the dtype and placement its loader gives it). Parts:

- `qwen3_audio_tower`: the family's `AudioTower` (Whisper log-mel features on the CPU, the
  encoder on the device), per caller utterance of 1, 2 and 8 s.
- `qwen3_code_predictor`: the family's `CodePredictor.residual_codes`, a frame's codebooks 1-15
  from the talker's state and codebook 0, for B turns at once as the Talker batches them (B the
  levels of streams), sampled as the reference samples (top-k 50, top-p 0.8, each row its own
  generator): milliseconds a batch, and how many calls that keeps at real time (a frame is
  80 ms of speech).
- `qwen3_code2wav`: the family's `Code2WavRenderer`, streamed and batched: each stream one reply
  of `CODE2WAV_FRAMES` frames cut into the Talker's groups (1, 1, 1, 2, then 4 frames: the
  cascade's 4, 8, 16, 32 then 64 codes a group, each ending at a whole frame), every round's
  jobs rendered together in batches of the VoiceBox's `max_batch` (`gpu_torch_streams.run_rounds`:
  time to a stream's first audio, real-time factors).
- `qwen3_thinker_rows`: the family's `TalkerInputs` over a `Qwen3MoeModel` of the thinker's
  first `accept_hidden_layer` layers and its embedding table (24 of 48 layers, 15.3B, 28.4 GiB
  in bfloat16 at real size) and the talker's projections: the layer-k states of a prompt of N
  rows (`layer_states`), and reply rows for each level of concurrent requests, projected
  together (`reply_rows_many`). At real size it runs only where its weights and
  `STATES_MARGIN_GIB` fit the device's free memory; otherwise it is reported as not run, saying
  how much it needs and how much is free.

Nothing here imports vLLM or the server's stack.
"""

from __future__ import annotations

import copy
import itertools
import math
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent.bench.gpu_torch_kit import (
    GIB,
    REPEATS,
    UTTERANCE_S,
    Target,
    dtype_name,
    figure,
    median_s,
    on_device,
    parameters,
    weight_gib,
)
from pipeline.families.kit.transformers_internals import model_from_config

PROMPT_ROWS = {"real": (64, 512, 2048), "tiny": (64, 512)}
CODE2WAV_FRAMES = {"real": 25, "tiny": 10}  # per reply: 2.0 s, 0.8 s of speech
FIRST_GROUP_CODES, GROUP_CODES = 4, 64  # the cascade's first group; qwen3-omni's `group`
FRAME_S = 0.08  # a frame's speech: 12.5 frames a second
SAMPLE_RATE = 24000
STATES_MARGIN_GIB = 4.0  # beyond the layer copy's weights: activations, the allocator's slack


def qwen3_config(size: str) -> Any:
    """Qwen3-Omni-30B-A3B's configuration (real) or the family's tiny one (typed Any: its
    sub-configs are unions)."""
    if size == "real":
        from pipeline.families.qwen3_omni.real_size import real_config

        return real_config()
    from pipeline.families.qwen3_omni.tiny_config import tiny_config

    return tiny_config()


# ---- the audio tower ----


def audio_tower_part(target: Target) -> dict[str, Any]:
    """The audio tower's milliseconds per utterance and per second of caller audio."""
    from transformers import WhisperFeatureExtractor

    from agent.bench.gpu_torch_parts import caller_audio
    from pipeline.families.kit.torch_placement import Placement
    from pipeline.families.kit.transformers_internals import qwen3_audio_encoder_class
    from pipeline.families.qwen3_omni.audio_tower import AudioTower

    config = qwen3_config(target.size).thinker_config.audio_config
    # built in its dtype, then moved (as AudioTower.load places it)
    encoder = on_device(lambda: model_from_config(qwen3_audio_encoder_class(), config,
                                                  dtype=target.dtype), target.device)
    tower = AudioTower(WhisperFeatureExtractor(feature_size=config.num_mel_bins), encoder,
                       Placement(target.device, target.dtype))
    rows = []
    for seconds in UTTERANCE_S:
        audio = caller_audio(seconds)
        ms = 1000 * median_s(partial(tower.encode, audio), target.device, REPEATS)
        features = int(tower.encode(audio).shape[0])
        rows.append({"audio_s": seconds, "rows": features, "ms": figure(ms),
                     "ms_per_audio_s": figure(ms / seconds)})
    return {"parameters": parameters(encoder), "weight_gib": figure(weight_gib(encoder)),
            "dtype": dtype_name(target.dtype), "utterances": rows}


# ---- the code predictor ----


def code_predictor_part(target: Target, levels: list[int]) -> dict[str, Any]:
    """The code predictor's milliseconds for a batch of B frames (B turns), per level."""
    from pipeline.families.qwen3_omni.code_predictor import PREDICTOR_SAMPLING

    talker = qwen3_config(target.size).talker_config
    predictor = predictor_on(target, talker)
    codebook = int(talker.code_predictor_config.vocab_size)
    rows = []
    for batch in [1, *levels]:  # the first: a warm-up
        states = torch.randn(batch, predictor.hidden_size, device=target.device) * 0.5
        first = torch.randint(0, codebook, (batch,))
        generators = [torch.Generator().manual_seed(row) for row in range(batch)]
        run = partial(predictor.residual_codes, states, first, [PREDICTOR_SAMPLING] * batch,
                      generators)
        ms = 1000 * median_s(run, target.device, REPEATS)
        rows.append({"frames": batch, "ms": figure(ms), "ms_per_frame": figure(ms / batch),
                     "calls_at_real_time": figure(batch * FRAME_S * 1000 / ms)})
    return {"parameters": parameters(predictor.model), "weight_gib": figure(
        weight_gib(predictor.model)), "dtype": dtype_name(target.dtype),
        "codebooks_predicted": predictor.groups - 1, "levels": rows[1:]}


def predictor_on(target: Target, talker: Any) -> Any:
    """A `CodePredictor` of random weights on the target (as `CodePredictor.load` places one:
    every parameter and buffer in its dtype), with a random codec embedding of the talker's."""
    from torch import nn

    from pipeline.families.qwen3_omni.code_predictor import CodePredictor, PredictorModel

    model = on_device(lambda: model_from_config(PredictorModel, talker.code_predictor_config,
                                                dtype=target.dtype), target.device, target.dtype)
    text = talker.text_config
    embedding = on_device(lambda: nn.Embedding(text.vocab_size, text.hidden_size),
                          target.device, target.dtype)
    return CodePredictor(model, embedding)


# ---- code2wav ----


def code2wav_part(target: Target, levels: list[int]) -> dict[str, Any]:
    """Code2wav streamed at each level of concurrent streams (`run_rounds`)."""
    from transformers import Qwen3OmniMoeCode2Wav

    from pipeline.families.qwen3_omni.code2wav import Code2WavRenderer

    config = qwen3_config(target.size).code2wav_config
    # built in its dtype on the device, the rotary frequencies float32 (as load_code2wav)
    model = on_device(lambda: model_from_config(Qwen3OmniMoeCode2Wav, config, dtype=target.dtype),
                      target.device)
    renderer = Code2WavRenderer(model)
    frames = CODE2WAV_FRAMES[target.size]
    row: dict[str, Any] = {
        "parameters": parameters(model), "weight_gib": figure(weight_gib(model)),
        "dtype": dtype_name(target.dtype), "frames_per_stream": frames,
        "frames_per_group": frame_groups(frames), "window_frames": renderer.window}
    row["levels"] = [_code2wav_level(renderer, n, target) for n in [1, *levels]][1:]  # warm-up
    return row


def frame_groups(frames: int) -> list[int]:
    """The frames of each Talker group of one reply: groups count codes (16 a frame), the first
    FIRST_GROUP_CODES, each next twice the one before up to GROUP_CODES, each ending at the
    first whole frame that fills it."""
    groups, size, left = [], FIRST_GROUP_CODES, frames
    while left > 0:
        take = min(left, math.ceil(size / 16))
        groups.append(take)
        left -= take
        size = min(2 * size, GROUP_CODES)
    return groups


def _code2wav_level(renderer: Any, streams: int, target: Target) -> dict[str, Any]:
    """`streams` replies at once through `renderer` (a Code2WavRenderer)."""
    from agent.bench.gpu_torch_streams import level_figures, run_rounds
    from pipeline.families.qwen3_omni.code2wav import StreamState

    frames = CODE2WAV_FRAMES[target.size]
    replies = []
    for _ in range(streams):
        state = StreamState()
        codes = torch.randint(0, renderer.codebook_size, (renderer.num_quantizers, frames))
        bounds = itertools.pairwise(np.cumsum([0, *frame_groups(frames)]).tolist())
        replies.append([(state, codes[:, start:end]) for start, end in bounds])

    def render(batch: list[tuple[Any, torch.Tensor]]) -> object:
        return renderer.render_batch([state for state, _ in batch], [job for _, job in batch])

    run = run_rounds(replies, render, lambda _: True, target.device)
    return level_figures(run, renderer.samples_after(frames) / SAMPLE_RATE)


# ---- the Thinker's rows for the Talker ----


def thinker_rows_part(target: Target, levels: list[int]) -> dict[str, Any]:
    """The layer copy's milliseconds per prompt of N rows, and the reply rows' per level of
    concurrent requests; or why it was not run (the device's free memory)."""
    config = qwen3_config(target.size)
    layers = int(config.talker_config.accept_hidden_layer)
    states_config = first_layers_config(config, layers, target.dtype)
    need = states_gib(states_config, target.dtype)
    if target.size == "real":
        if not target.cuda:
            return {"not_run": "not run: --size real needs a GPU"}
        free = torch.cuda.mem_get_info(target.device)[0] / GIB
        if need + STATES_MARGIN_GIB > free:
            return {"not_run": f"skipped: the first {layers} layers and the embedding table "
                    f"take {need:.1f} GiB in {dtype_name(target.dtype)}, with "
                    f"{STATES_MARGIN_GIB:.0f} GiB beside them for activations; "
                    f"{free:.1f} GiB of the device are free"}
    inputs = talker_inputs_on(target, config, states_config)
    hidden = int(config.thinker_config.text_config.hidden_size)
    prompts = []
    for rows in PROMPT_ROWS[target.size]:
        embeds = torch.randn(rows, hidden, device=target.device, dtype=target.dtype) * 0.02
        run = partial(layer_states, inputs, embeds)
        prompts.append({"rows": rows, "ms": figure(1000 * median_s(run, target.device,
                                                                   REPEATS))})
    replies = []
    for requests in levels:
        run = partial(inputs.reply_rows_many, [[7] for _ in range(requests)])
        ms = 1000 * median_s(run, target.device, REPEATS)
        replies.append({"requests": requests, "ms": figure(ms),
                        "ms_per_request": figure(ms / requests)})
    return {"parameters": parameters(inputs.states), "weight_gib": figure(
        weight_gib(inputs.states)), "dtype": dtype_name(target.dtype), "layers": layers,
        "prompts": prompts, "reply_rows": replies}


@torch.inference_mode()
def layer_states(inputs: Any, embeds: torch.Tensor) -> torch.Tensor:
    """The layer copy's states over a prompt's rows, as `TalkerInputs.prompt_part` runs it."""
    states: torch.Tensor = inputs.layer_states(embeds)
    return states


def first_layers_config(config: Any, layers: int, dtype: torch.dtype) -> Any:
    """The thinker LM's configuration as the build writes it (`thinker_lm.lm_config`'s fields,
    through `qwen3_moe_lm.lm_config`), cut to `layers` layers as `thinker_rows.first_layers`
    cuts it."""
    from pipeline.families.qwen3_omni import qwen3_moe_lm

    text = copy.deepcopy(config.thinker_config.text_config)
    text.dtype = dtype  # given: the release directory (only read for its dtype) is not needed
    return qwen3_moe_lm.lm_config(
        Path("."), text, num_hidden_layers=layers,
        decoder_sparse_step=text.decoder_sparse_step, mlp_only_layers=list(text.mlp_only_layers),
        tie_word_embeddings=text.tie_word_embeddings)


def states_gib(states_config: Any, dtype: torch.dtype) -> float:
    """The layer copy's weights in GiB (counted on the meta device)."""
    from transformers import Qwen3MoeModel

    meta = on_device(lambda: Qwen3MoeModel(states_config), torch.device("meta"))
    return parameters(meta) * torch.tensor([], dtype=dtype).element_size() / GIB


def talker_inputs_on(target: Target, config: Any, states_config: Any) -> Any:
    """The family's `TalkerInputs` of random weights on the target, placed as its loader
    places them (the cut model un-normed, as a middle layer's state is)."""
    from transformers import Qwen3MoeModel
    from transformers.activations import ACT2FN

    from pipeline.families.qwen3_omni.thinker_rows import Projection, RoleIds, TalkerInputs

    states = on_device(lambda: model_from_config(Qwen3MoeModel, states_config,
                                                 dtype=target.dtype), target.device, target.dtype)
    if states_config.num_hidden_layers < config.thinker_config.text_config.num_hidden_layers:
        states.norm = torch.nn.Identity()
    talker = config.talker_config
    width, out = int(talker.thinker_hidden_size), int(talker.text_config.hidden_size)
    act = ACT2FN[talker.text_config.hidden_act]

    def projection() -> Projection:
        tensors = {"linear_fc1.weight": torch.randn(width, width) * 0.02,
                   "linear_fc1.bias": torch.zeros(width),
                   "linear_fc2.weight": torch.randn(out, width) * 0.02,
                   "linear_fc2.bias": torch.zeros(out)}
        return on_device(lambda: Projection(tensors, act), target.device, target.dtype)

    roles = RoleIds(int(config.im_start_token_id), int(config.user_token_id),
                    int(config.assistant_token_id))
    return TalkerInputs(states, projection(), projection(), roles)
