"""Qwen3-Omni's code2wav as a stream (`qwen3_omni/code2wav.py`) against the reference run whole.

On the tiny release's code2wav (transformers' `Qwen3OmniMoeCode2Wav`, RANDOM weights from the
build's fixed seed, constants perturbed, audio peaking near 0.45), float32, CPU, one torch
thread. An utterance of 40 frames (more than three of the tiny transformer's 12-frame windows)
is fed as a first call of 1, 3 or 8 frames, then 5 at a time; the joined audio must be the
reference's decode of the 40 frames at once, sample for sample.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn
from transformers import DynamicCache, Qwen3OmniMoeCode2Wav, Qwen3OmniMoeForConditionalGeneration

from pipeline.families.kit.release_build import release_dir
from pipeline.families.kit.transformers_internals import code2wav_parts
from pipeline.families.qwen3_omni.build import build_qwen3_omni
from pipeline.families.qwen3_omni.code2wav import (
    StreamingCode2Wav,
    stateful_layers,
    streamed,
)
from pipeline.families.qwen3_omni.tiny_config import CODE2WAV_WINDOW

FRAMES = 40
LATER = 5  # frames a call after the first
SAMPLES_PER_FRAME = 1920  # 2 * 2 * 8 * 5 * 4 * 3, as published
HELD_BACK = 555  # the reference's right trims, chained: (((8 + 1) 5 + 1) 4 + 1) 3
TOLERANCE = 1e-5  # max |streamed - whole| sample difference; measured 2.4e-7 (float rounding)
DROPPED_WORSE = 1e-3  # a piece of context dropped; measured 0.024 (keys and values), 0.19
# (the convolutions' left context), 0.46 (chunks decoded alone)


@pytest.fixture(scope="module")
def code2wav(tmp_path_factory: pytest.TempPathFactory) -> Qwen3OmniMoeCode2Wav:
    torch.set_num_threads(1)
    models = tmp_path_factory.mktemp("models")
    release = release_dir(build_qwen3_omni(models, progress=False))
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(release)
    part: Qwen3OmniMoeCode2Wav = model.code2wav.eval()
    return part


@pytest.fixture(scope="module")
def codes() -> torch.Tensor:
    """An utterance's frames: (16 codebooks, FRAMES), random codes from a fixed seed."""
    return torch.randint(0, 128, (16, FRAMES), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def whole(code2wav: Qwen3OmniMoeCode2Wav, codes: torch.Tensor) -> torch.Tensor:
    """The reference's decode of the whole utterance at once (1-D)."""
    with torch.inference_mode():
        wave: torch.Tensor = code2wav(codes[None]).reshape(-1)
    return wave


def calls(first: int) -> list[tuple[int, int]]:
    """The frames of each call: `first`, then LATER at a time to the end."""
    bounds = [0, *range(first, FRAMES, LATER), FRAMES]
    return list(itertools.pairwise(bounds))


def stream(code2wav: Qwen3OmniMoeCode2Wav, codes: torch.Tensor, first: int,
           forget_keys: bool = False, forget_convolutions: bool = False) -> list[torch.Tensor]:
    """Each call's audio; `forget_*` drops that part of the kept context before each later
    call (what a renderer without it would do)."""
    renderer = StreamingCode2Wav(code2wav)
    audio = []
    for start, end in calls(first):
        if start and forget_keys:
            renderer.cache = DynamicCache(config=code2wav.config)
        if start and forget_convolutions:
            for layer in stateful_layers(renderer.convolutions):
                layer.tail = None
        audio.append(renderer.render(codes[:, start:end]))
    return audio


def test_the_tiny_reference_speaks_clear_of_its_clamp(whole: torch.Tensor) -> None:
    # otherwise a tolerance of 1e-5 would say nothing (transformers' initialisation speaks at
    # 2e-6), or the clamp at 1 would hide differences where it bites
    assert 0.1 < float(whole.abs().max()) < 0.9
    assert CODE2WAV_WINDOW < FRAMES / 3  # the sliding window is crossed, more than once


@pytest.mark.parametrize("first", [1, 3, 8])
def test_the_stream_is_the_whole_decode(code2wav: Qwen3OmniMoeCode2Wav, codes: torch.Tensor,
                                        whole: torch.Tensor, first: int) -> None:
    audio = stream(code2wav, codes, first)
    # a first call's n frames give what the reference gives for them; each later frame 1920
    assert [len(part) for part in audio] == (
        [first * SAMPLES_PER_FRAME - HELD_BACK]
        + [(end - start) * SAMPLES_PER_FRAME for start, end in calls(first)[1:]])
    joined = torch.cat(audio)
    assert joined.shape == whole.shape == (FRAMES * SAMPLES_PER_FRAME - HELD_BACK,)
    assert float((joined - whole).abs().max()) <= TOLERANCE


def test_each_piece_of_kept_context_is_needed(code2wav: Qwen3OmniMoeCode2Wav,
                                              codes: torch.Tensor, whole: torch.Tensor) -> None:
    """The parity above is not vacuous: without the transformer's keys and values, or without
    the convolutions' left context, or with no context at all, the audio differs."""
    for dropped in ({"forget_keys": True}, {"forget_convolutions": True}):
        joined = torch.cat(stream(code2wav, codes, 3, **dropped))
        assert joined.shape == whole.shape
        assert float((joined - whole).abs().max()) > DROPPED_WORSE, dropped
    with torch.inference_mode():  # the reference run on each call's frames alone
        alone = [code2wav(codes[None, :, start:end]).reshape(-1) for start, end in calls(3)]
    first = len(alone[0])
    # causal: the first frames alone are the whole decode's start (nothing later is needed)
    assert float((alone[0] - whole[:first]).abs().max()) <= TOLERANCE
    assert float((alone[1] - whole[first: first + len(alone[1])]).abs().max()) > DROPPED_WORSE


def test_a_reset_stream_starts_a_new_utterance(code2wav: Qwen3OmniMoeCode2Wav,
                                               codes: torch.Tensor) -> None:
    renderer = StreamingCode2Wav(code2wav)
    first = renderer.render(codes[:, :4])
    renderer.render(codes[:, 4:9])
    renderer.reset()
    assert (renderer.frames, renderer.samples) == (0, 0)
    assert torch.equal(renderer.render(codes[:, :4]), first)


def test_no_frames_give_no_audio_and_bad_shapes_are_refused(
        code2wav: Qwen3OmniMoeCode2Wav, codes: torch.Tensor) -> None:
    renderer = StreamingCode2Wav(code2wav)
    assert renderer.render(codes[:, :0]).shape == (0,)
    with pytest.raises(ValueError, match="num_quantizers=16"):
        renderer.render(codes[:8])
    with pytest.raises(TypeError, match="Linear is unknown"):
        streamed(nn.Linear(2, 2), code2wav_parts())
