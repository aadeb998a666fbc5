"""What a `omnivox bench gpu-torch` run will hold and take, worked out before it runs: each part
built on torch's meta device (shapes only, no memory), its weights in GiB and the floating-point
work of the planned timings (torch's FlopCounterMode over one window, one utterance, on meta),
turned into seconds at an assumed rate. The rates are guesses (eager PyTorch on small batches
reaches a fraction of a GPU's peak); the memory is exact for the weights, which dominate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from agent.bench import gpu_torch_parts as parts
from agent.bench import gpu_torch_qwen3 as qwen3
from agent.bench import gpu_torch_streams as streams
from agent.bench.gpu_torch_kit import (
    Target,
    dtype_name,
    figure,
    omni_config,
    on_device,
    parameters,
    qwen2_config,
    thinker_config,
)
from pipeline.families.kit.transformers_internals import audio_encoder_class, model_from_config

META = torch.device("meta")
# effective TFLOP/s assumed on one H200 (dense peaks: about 990 bf16, 67 float32 without TF32)
ASSUMED_TFLOPS = {"bfloat16": 200.0, "float16": 200.0, "float32": 30.0}
FIXED_S = 90.0  # imports, CUDA context, building on the device, the IPC tests: a guess
WINDOW_TOKENS = 52  # a typical token2wav window: 24 context + 16 new + 12 lookahead
SNAC_WINDOW_FRAMES = 8  # a typical SNAC window: 3 context + 2 voiced + 3 lookahead


def estimate(target: Target, levels: Sequence[int], snac: bool) -> dict[str, Any]:
    """Per part: parameters, weight GiB, planned TFLOP and seconds; the whole run's seconds."""
    rate = ASSUMED_TFLOPS[dtype_name(target.dtype)] * 1e12
    sized = {"token2wav": _token2wav(target, levels), "audio_tower": _audio_tower(target),
             "thinker_states": _thinker_states(target),
             "qwen3_audio_tower": _qwen3_audio_tower(target),
             "qwen3_code_predictor": _qwen3_code_predictor(target, levels),
             "qwen3_code2wav": _qwen3_code2wav(target, levels),
             "qwen3_thinker_rows": _qwen3_thinker_rows(target)}
    if snac:
        sized["snac"] = _snac(target, levels)
    rows = {name: {"parameters": count, "weight_gib": figure(count * _bytes(name, target) / 2**30),
                   "tflop": figure(flop / 1e12), "seconds": figure(flop / rate)}
            for name, (count, flop) in sized.items()}
    return {"parts": rows, "assumed_tflops": ASSUMED_TFLOPS[dtype_name(target.dtype)],
            "fixed_s": FIXED_S,
            "seconds": figure(FIXED_S + sum(row["seconds"] for row in rows.values())),
            "largest_part_gib": max(row["weight_gib"] for row in rows.values())}


def flops(run: Callable[[], object]) -> float:
    """The floating-point operations `run()` does on meta tensors. A forward that ends by
    copying its result to the CPU (BigVGAN's does) stops there: everything before is counted."""
    # "Cannot copy out of meta tensor": the final .cpu()
    with FlopCounterMode(display=False) as counter, torch.device(META), \
            contextlib.suppress(NotImplementedError):
        run()
    return float(counter.get_total_flops())


def _bytes(name: str, target: Target) -> int:
    """Bytes per parameter: SNAC runs float32 (its VoiceBox's dtype), the rest in the target's."""
    dtype = torch.float32 if name == "snac" else target.dtype
    return torch.tensor([], dtype=dtype).element_size()


def _token2wav(target: Target, levels: Sequence[int]) -> tuple[int, float]:
    from transformers import Qwen2_5OmniToken2WavModel

    config: Any = omni_config(target.size).token2wav_config
    model = on_device(lambda: model_from_config(Qwen2_5OmniToken2WavModel, config), META)
    dit, frames = model.code2wav_dit_model, WINDOW_TOKENS * config.dit_config.repeats
    evaluations = 4 * (streams.NUM_STEPS[target.size] - 1)  # RK4 over the ODE's steps
    per_eval = flops(lambda: dit(
        hidden_states=torch.zeros(1, frames, dit.mel_dim),
        speaker_embedding=torch.zeros(1, frames, config.dit_config.enc_emb_dim),
        condition_vector=torch.zeros(1, streams.REFERENCE_MEL_FRAMES, dit.mel_dim),
        quantized_code=torch.zeros(1, WINDOW_TOKENS, dtype=torch.long),
        time_step=torch.tensor(0.5), apply_cfg=True))
    vocoder = flops(lambda: model.code2wav_bigvgan_model(torch.zeros(1, dit.mel_dim, frames)))
    tokens = streams.TOKEN2WAV_TOKENS[target.size]
    windows = -(-tokens // streams.GROUP) * (1 + sum(levels) + levels[0])  # + warm-up, float32
    return parameters(model), windows * (evaluations * per_eval + vocoder)


def _snac(target: Target, levels: Sequence[int]) -> tuple[int, float]:
    from snac import SNAC

    from agent.bench.gpu_torch_kit import snac_config

    model = on_device(lambda: SNAC(**snac_config(target.size)), META)
    codes = [torch.zeros(1, SNAC_WINDOW_FRAMES * n, dtype=torch.long) for n in (1, 2, 4)]
    window = flops(lambda: model.decode(codes))
    per_reply = -(-streams.SNAC_FRAMES[target.size] // (streams.GROUP // 7))
    return parameters(model), window * per_reply * (1 + sum(levels))


def _audio_tower(target: Target) -> tuple[int, float]:
    """Two FLOPs a parameter a row: 25 rows a second of audio, 50 between its convolutions and
    its pooling, where its layers run (the encoder's shapes depend on the audio's length, which
    meta tensors cannot hold)."""
    Qwen2_5OmniAudioEncoder = audio_encoder_class()

    config = thinker_config(target.size).audio_config
    encoder = on_device(lambda: model_from_config(Qwen2_5OmniAudioEncoder, config), META)
    rows = 50 * sum(parts.UTTERANCE_S) * (1 + parts.REPEATS)
    return parameters(encoder), 2.0 * parameters(encoder) * rows


def _thinker_states(target: Target) -> tuple[int, float]:
    """Two FLOPs a parameter a row (the embedding table does none), at the layers it will run."""
    from transformers import Qwen2Model

    text = thinker_config(target.size).text_config
    layers = parts.states_layers(target, text)
    model = on_device(lambda: Qwen2Model(qwen2_config(text, layers)), META)
    count = parameters(model)
    rows = sum(parts.PROMPT_ROWS) * (1 + parts.REPEATS) + parts.PROMPT_ROWS[0] + parts.REPLY_STEPS
    return count, 2.0 * (count - text.vocab_size * text.hidden_size) * rows


def _qwen3_audio_tower(target: Target) -> tuple[int, float]:
    """Two FLOPs a parameter a row, at 13 rows a second of audio (the encoder's output rate;
    its convolutions run before at higher rates: an underestimate)."""
    from pipeline.families.kit.transformers_internals import qwen3_audio_encoder_class

    config = qwen3.qwen3_config(target.size).thinker_config.audio_config
    encoder = on_device(lambda: model_from_config(qwen3_audio_encoder_class(), config), META)
    rows = 13 * sum(qwen3.UTTERANCE_S) * (2 + qwen3.REPEATS)  # + the rows counted once
    return parameters(encoder), 2.0 * parameters(encoder) * rows


def _qwen3_code_predictor(target: Target, levels: Sequence[int]) -> tuple[int, float]:
    """Two FLOPs a parameter a row, 16 rows a frame (a prefill of two, then 14 steps of one;
    each step reads one of its 15 heads and embeddings, so this overestimates)."""
    from pipeline.families.qwen3_omni.code_predictor import PredictorModel

    talker = qwen3.qwen3_config(target.size).talker_config
    model = on_device(lambda: model_from_config(PredictorModel, talker.code_predictor_config),
                      META)
    frames = (1 + sum(levels)) * (1 + qwen3.REPEATS)
    return parameters(model), 2.0 * parameters(model) * 16 * frames


def _qwen3_code2wav(target: Target, levels: Sequence[int]) -> tuple[int, float]:
    """One reply's whole decode per stream of each level: its convolutions (upsampling and
    decoder: torch's FlopCounterMode on meta, where most of the work is) and two FLOPs a
    transformer parameter a frame (its forward cannot run on meta)."""
    from transformers import Qwen3OmniMoeCode2Wav

    config = qwen3.qwen3_config(target.size).code2wav_config
    model = on_device(lambda: model_from_config(Qwen3OmniMoeCode2Wav, config), META)
    frames = qwen3.CODE2WAV_FRAMES[target.size]

    def convolutions() -> torch.Tensor:
        samples = torch.zeros(1, config.hidden_size, frames)
        for layer in [*(block for blocks in model.upsample for block in blocks), *model.decoder]:
            samples = layer(samples)
        return samples

    reply = flops(convolutions) + 2.0 * parameters(model.pre_transformer) * frames
    return parameters(model), reply * (1 + sum(levels))


def _qwen3_thinker_rows(target: Target) -> tuple[int, float]:
    """Two FLOPs an active parameter a row (the routed experts a row takes, attention, router;
    the embedding table does none) over the prompts."""
    from transformers import Qwen3MoeModel

    config = qwen3.qwen3_config(target.size)
    text = config.thinker_config.text_config
    states_config = qwen3.first_layers_config(
        config, int(config.talker_config.accept_hidden_layer), target.dtype)
    model = on_device(lambda: Qwen3MoeModel(states_config), META)
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    dense = parameters(model) - experts - text.vocab_size * text.hidden_size
    active = dense + experts * text.num_experts_per_tok / text.num_experts
    rows = sum(qwen3.PROMPT_ROWS[target.size]) * (1 + qwen3.REPEATS)
    return parameters(model), 2.0 * active * rows
