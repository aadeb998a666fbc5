"""The orpheus family without engines: id <-> code mapping, frames, SNAC windowed decoding.

SNAC here is the `snac` package's own model with the 24 kHz framing and the tiny build's widths
and random weights (fixed seed). Its noise blocks add fresh random noise on every decode, by
design; the window parity is a property of the deterministic rest, so those tests zero the
noise blocks' weights (their output is then exactly zero).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from snac.layers import NoiseBlock

from pipeline.families.orpheus.build import TINY_SNAC
from pipeline.families.orpheus.codes import (
    AUDIO_BASE,
    AUDIO_IDS,
    CODEBOOK_SIZE,
    FRAME,
    FrameAssembler,
    code_of,
    codebooks,
)
from pipeline.families.orpheus.release import check_talker
from pipeline.families.orpheus.snac_decoder import SnacDecoder, write_snac
from pipeline.families.orpheus.voicebox import SnacVoiceBox
from pipeline.families.orpheus.windows import Window, WindowCutter
from pipeline.stage import StageContext, VoiceBoxJob, VoiceBoxOutput
from pipeline.tensors.shm import BlockPool

FRAMES = 20
# Measured (20 random frames, windows of 2 frames): 3 frames of context and of lookahead give
# a max difference of 3.1e-7 to one full decode (audio peak 0.78); 2 and 2 give 2.4e-4, 1 and
# 1 give 8.4e-3, no context and no lookahead 0.58.
PARITY_TOLERANCE = 2e-6
NO_CONTEXT_MIN_ERROR = 0.1
# The first window voices the first frame before any lookahead exists: measured 0.49 off.


def token_of(code: int, index: int) -> int:
    """The id of the `index`-th audio token for `code` (the inverse of `code_of`)."""
    if not 0 <= code < CODEBOOK_SIZE:
        raise ValueError(f"code {code} outside [0, {CODEBOOK_SIZE})")
    return AUDIO_BASE + (index % FRAME) * CODEBOOK_SIZE + code


def test_id_code_mapping_round_trips_at_every_frame_position() -> None:
    for index in range(2 * FRAME):
        for code in (0, 1, 2047, CODEBOOK_SIZE - 1):
            token = token_of(code, index)
            assert token in AUDIO_IDS
            assert code_of(token, index) == code
    assert token_of(0, 0) == AUDIO_BASE == 128266
    assert token_of(5, 3) == 128266 + 3 * 4096 + 5
    assert AUDIO_IDS.stop == 128266 + 7 * 4096
    with pytest.raises(ValueError):
        token_of(CODEBOOK_SIZE, 0)


def test_ids_outside_their_position_are_skipped_and_frames_are_whole() -> None:
    codes = [[(7 * f + p) % CODEBOOK_SIZE for p in range(FRAME)] for f in range(3)]
    ids = [token_of(code, p) for frame in codes for p, code in enumerate(frame)]
    noisy = [*ids[:3], AUDIO_BASE - 1, token_of(9, 5), *ids[3:]]  # below the range; wrong slot
    assembler = FrameAssembler()
    frames = assembler.feed(noisy[:10]) + assembler.feed(noisy[10:])
    assert frames == codes
    assert assembler.skipped == 2 and assembler.codes == []


def test_a_frame_spreads_over_snacs_three_codebooks_in_time_order() -> None:
    frames = torch.arange(2 * FRAME).reshape(1, 2, FRAME)  # frame f, position p -> 7f + p
    coarse, middle, fine = codebooks(frames)
    assert coarse.tolist() == [[0, 7]]
    assert middle.tolist() == [[1, 4, 8, 11]]
    assert fine.tolist() == [[2, 3, 5, 6, 9, 10, 12, 13]]


def test_window_tokens_round_trip_and_malformed_ones_are_refused() -> None:
    window = Window([[1] * FRAME, [2] * FRAME, [3] * FRAME], context=1, lookahead=1)
    assert Window.of_tokens(window.tokens()) == window and window.voiced == 1
    for bad in ([0, 0, 1, 2], [1, 1, *([0] * 2 * FRAME)], [-1, 0, *([0] * FRAME)], [], [0]):
        with pytest.raises(ValueError):
            Window.of_tokens(bad)


@pytest.fixture(scope="module")
def snac(tmp_path_factory: pytest.TempPathFactory) -> SnacDecoder:
    """The tiny build's SNAC with its noise blocks' weights zeroed (deterministic decode)."""
    directory: Path = tmp_path_factory.mktemp("snac")
    write_snac(directory, TINY_SNAC, seed=4322)
    decoder = SnacDecoder.load(directory)
    for module in decoder.model.modules():
        if isinstance(module, NoiseBlock):
            torch.nn.init.zeros_(module.linear.parametrizations.weight.original0)
    return decoder


def _streamed(snac: SnacDecoder, frames: list[list[int]], cutter: WindowCutter) -> torch.Tensor:
    """Feed frames one at a time, as a Talker does; decode all windows (batched by length)."""
    windows = [w for frame in frames for w in cutter.add([frame])] + cutter.finish()
    assert sum(w.voiced for w in windows) == len(frames)
    return torch.cat(snac.render(windows))


def test_windowed_decode_equals_one_full_decode(snac: SnacDecoder) -> None:
    frames = torch.randint(0, CODEBOOK_SIZE, (FRAMES, FRAME),
                           generator=torch.Generator().manual_seed(5))
    full = snac.decode(frames[None])[0]
    assert full.shape == (FRAMES * snac.samples_per_frame,) == (FRAMES * 2048,)
    assert snac.sample_rate == 24000
    first = snac.samples_per_frame  # voiced before any lookahead came: not expected equal
    for group in (1, 2, 3):
        streamed = _streamed(snac, frames.tolist(), WindowCutter(group=group))
        error = (streamed - full)[first:].abs().max().item()
        assert error < PARITY_TOLERANCE, (group, error)
    bare = _streamed(snac, frames.tolist(), WindowCutter(group=2, context=0, lookahead=0))
    assert (bare - full)[first:].abs().max().item() > NO_CONTEXT_MIN_ERROR


async def test_the_voicebox_answers_a_turns_closing_job_empty_and_serves_on(
        tmp_path: Path) -> None:
    """The closing job turn.py sends each turn (no tokens) yields nothing and finishes; the
    stage then still renders windows (a job too short to be a window once killed its task)."""
    write_snac(tmp_path, TINY_SNAC, seed=4322)
    pool = BlockPool.create(f"omnivox-snac-voicebox-{os.getpid()}", block_count=4,
                            block_size=1 << 20)
    voicebox = SnacVoiceBox()
    try:
        await voicebox.start(StageContext(pool, {"model_dir": str(tmp_path)}, str(tmp_path)))
        closing = [out async for out in voicebox.stream(VoiceBoxJob("c/t/voicebox/end", []))]
        assert closing == [VoiceBoxOutput("c/t/voicebox/end", finished=True)]
        window = Window([[1] * FRAME, [2] * FRAME], context=0, lookahead=0)
        (out,) = [out async for out in voicebox.stream(VoiceBoxJob("c/t/voicebox/0.0",
                                                                   window.tokens()))]
        assert out.pcm is not None and out.pcm.shape == (2 * 2048,)
        pool.release(out.pcm)
        assert pool.in_use == 0
    finally:
        await voicebox.stop()
        pool.close()
        pool.unlink()


def test_a_talker_directory_of_another_architecture_is_refused(tmp_path: Path) -> None:
    config = {"architectures": ["LlamaForCausalLM"], "vocab_size": 156940}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert check_talker(tmp_path) == tmp_path
    for wrong in ({"architectures": ["Qwen2ForCausalLM"]}, {"vocab_size": 128256}):
        (tmp_path / "config.json").write_text(json.dumps({**config, **wrong}))
        with pytest.raises(ValueError, match="not an Orpheus talker"):
            check_talker(tmp_path)
