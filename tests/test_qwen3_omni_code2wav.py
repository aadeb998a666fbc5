"""Qwen3-Omni's code2wav as a stream (`qwen3_omni/code2wav.py`) against the reference run whole.

On the tiny release's code2wav (transformers' `Qwen3OmniMoeCode2Wav`, RANDOM weights from the
build's fixed seed, constants perturbed, audio peaking near 0.74), float32, CPU, one torch
thread. An utterance of 40 frames (more than three of the tiny transformer's 12-frame windows)
is fed as a first call of 1, 3 or 8 frames, then 5 at a time; the joined audio must be the
reference's decode of the 40 frames at once, sample for sample. Three such utterances rendered
together (`Code2WavRenderer.render_batch`), in calls of different sizes after different
histories, must each be what it is alone.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn
from transformers import Qwen3OmniMoeCode2Wav, Qwen3OmniMoeForConditionalGeneration

from pipeline.families.kit.transformers_internals import code2wav_parts
from pipeline.families.qwen3_omni.build import SEED
from pipeline.families.qwen3_omni.code2wav import (
    Code2WavRenderer,
    Ragged,
    StreamingCode2Wav,
    StreamState,
    streamed,
    window_mask,
)
from pipeline.families.qwen3_omni.release import write_tiny_release
from pipeline.families.qwen3_omni.tiny_config import CODE2WAV_WINDOW

FRAMES = 40
LATER = 5  # frames a call after the first
SAMPLES_PER_FRAME = 1920  # 2 * 2 * 8 * 5 * 4 * 3, as published
HELD_BACK = 555  # the reference's right trims, chained: (((8 + 1) 5 + 1) 4 + 1) 3
TOLERANCE = 1e-5  # max |streamed - whole| sample difference; measured 4.8e-7 (float rounding)
DROPPED_WORSE = 1e-3  # a piece of context dropped; measured 0.058 (keys and values), 0.52
# (the convolutions' left context), 0.74 (chunks decoded alone)


@pytest.fixture(scope="module")
def code2wav(tmp_path_factory: pytest.TempPathFactory) -> Qwen3OmniMoeCode2Wav:
    torch.set_num_threads(1)
    release = tmp_path_factory.mktemp("release")
    write_tiny_release(release, SEED)  # the family build's release
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
        if start and forget_keys:  # positions go on, the keys and values are gone
            renderer.stream.keys, renderer.stream.values = [], []
        if start and forget_convolutions:  # back to zeros, as at the start
            renderer.stream.tails = []
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
        streamed(nn.Linear(2, 2), code2wav_parts(), Ragged())


# Three utterances' calls, batch by batch (frames a call; 0: the stream sits the batch out),
# so that each batch mixes call sizes and histories (0 to 30 frames behind, the window crossed)
SCHEDULES = [[1, 5, 0, 8, 3, 7, 2, 6, 8], [3, 2, 7, 0, 0, 1, 8, 8, 8, 3],
             [8, 1, 1, 1, 4, 0, 6, 5, 6, 8]]
BATCH_TOLERANCE = 1e-5  # max |batched - alone| and |batched - whole|; measured 5.1e-7 each


def schedule_bounds(schedule: list[int], batches: int) -> list[tuple[int, int]]:
    """Each batch's frames (start, end) of an utterance called as `schedule` says."""
    bounds = list(itertools.pairwise(itertools.accumulate(schedule, initial=0)))
    return bounds + [(FRAMES, FRAMES)] * (batches - len(bounds))


@pytest.fixture(scope="module")
def utterances() -> list[torch.Tensor]:
    """Three utterances' frames, (16, FRAMES) each."""
    return [torch.randint(0, 128, (16, FRAMES), generator=torch.Generator().manual_seed(seed))
            for seed in (4, 5, 6)]


def test_streams_rendered_together_are_each_what_it_is_alone(
        code2wav: Qwen3OmniMoeCode2Wav, utterances: list[torch.Tensor]) -> None:
    assert all(sum(schedule) == FRAMES for schedule in SCHEDULES)
    batches = max(len(schedule) for schedule in SCHEDULES)
    bounds = [schedule_bounds(schedule, batches) for schedule in SCHEDULES]
    renderer = Code2WavRenderer(code2wav)
    states = [StreamState() for _ in utterances]
    together: list[list[torch.Tensor]] = [[] for _ in utterances]
    for batch in range(batches):
        calls = [bounds[row][batch] for row in range(len(utterances))]
        waves = renderer.render_batch(states, [codes[:, start:end] for codes, (start, end)
                                               in zip(utterances, calls, strict=True)])
        for row, wave in enumerate(waves):
            start, end = bounds[row][batch]
            # each call's audio: what the reference's decode of the frames so far adds
            assert wave.shape == (renderer.samples_after(end) - renderer.samples_after(start),)
            together[row].append(wave)
    for row, codes in enumerate(utterances):
        alone = StreamingCode2Wav(code2wav)
        solo = torch.cat([alone.render(codes[:, start:end]) for start, end in bounds[row]])
        with torch.inference_mode():
            whole = code2wav(codes[None]).reshape(-1)
        joined = torch.cat(together[row])
        assert joined.shape == solo.shape == whole.shape
        assert (states[row].frames, states[row].samples) == (FRAMES, whole.shape[0])
        errors = float((joined - solo).abs().max()), float((joined - whole).abs().max())
        print(f"\n[qwen3-omni-code2wav] stream {row} batched: vs alone {errors[0]:.2g}, "
              f"vs whole {errors[1]:.2g}")
        assert max(errors) <= BATCH_TOLERANCE


def test_the_window_mask_sees_each_streams_own_frames_only() -> None:
    # row 0: a new stream (no history); row 1: 20 frames behind it, 11 kept (window 12)
    mask = window_mask(torch.tensor([0, 20]), past=11, longest=3, window=12,
                       dtype=torch.float32)[:, 0] == 0
    assert mask.shape == (2, 3, 14)
    # the new stream's frame i sees its frames 0 .. i (keys 11 .. 11 + i), none padded before
    assert [row.nonzero().flatten().tolist() for row in mask[0]] == [[11], [11, 12], [11, 12, 13]]
    # the other's frame i sees the 11 - i kept frames still in its window and its new 0 .. i
    assert [row.nonzero().flatten().tolist() for row in mask[1]] == [
        list(range(0, 12)), list(range(1, 13)), list(range(2, 14))]


def test_bad_batches_are_refused(code2wav: Qwen3OmniMoeCode2Wav, codes: torch.Tensor) -> None:
    renderer = Code2WavRenderer(code2wav)
    state = StreamState()
    with pytest.raises(ValueError, match="twice in one batch"):
        renderer.render_batch([state, state], [codes[:, :2], codes[:, 2:4]])
    bad = codes[:, :2].clone()
    bad[5, 1] = 128  # one past the tiny codebooks
    with pytest.raises(ValueError, match=r"codes from 0 to 127 expected, got \d+ to 128"):
        renderer.render_batch([state], [bad])
    assert state.frames == 0 and not state.keys  # nothing rendered
    no_frames, one_frame = renderer.render_batch([state, StreamState()],
                                                 [codes[:, :0], codes[:, :1]])
    assert no_frames.shape == (0,) and one_frame.shape == (SAMPLES_PER_FRAME - HELD_BACK,)
    assert state.frames == 0  # left out of the forward
