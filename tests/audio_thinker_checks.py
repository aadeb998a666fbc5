"""What the tests of the omni families' Thinker stages (`kit/audio_thinker.py`; the tests
test_qwen25_omni_thinker.py and test_qwen3_omni_thinker_stage.py) check alike on each family:
a turn's reply outputs beside the recogniser's words, a recited reply, the caller's words heard
and scored, and a stream closed midway.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.families.kit.audio_thinker import AudioThinker
from pipeline.stage import ThinkerJob, ThinkerOutput
from pipeline.tensors.block_ref import BlockRef
from pipeline.tensors.shm import BlockPool
from tests.audio_fixtures import gliding_utterance, read_wav, speech_wav
from tests.stage_fixtures import print_figure
from tests.stage_outputs import thinker_rows

Messages = list[dict[str, str]]


async def reply_outputs(thinker: AudioThinker, job: ThinkerJob) -> list[ThinkerOutput]:
    """The outputs of a job with audio, less the recogniser's words (which come once, with no
    rows)."""
    outputs = [out async for out in thinker.stream(job)]
    heard = [out for out in outputs if out.transcript is not None]
    assert len(heard) == 1 and not heard[0].embeds, "the recogniser's words once, no rows"
    return [out for out in outputs if out.transcript is None]


@dataclass(frozen=True)
class Recited:
    """A recited job's outputs, their tokens, and their rows for the Talker joined."""

    outputs: list[ThinkerOutput]
    tokens: list[int]
    rows: torch.Tensor


async def recited(thinker: AudioThinker, pool: BlockPool, job: ThinkerJob) -> Recited:
    """A recited job through the stage (no engine request), its blocks released: its outputs'
    text is the job's, their tokens the text's own, and the last says "stop"."""
    assert job.recite is not None
    outputs = [out async for out in thinker.stream(job)]
    tokens = [t for out in outputs for t in out.token_ids]
    rows = thinker_rows(pool, outputs)
    assert "".join(out.text for out in outputs) == job.recite
    assert outputs[-1].finished and outputs[-1].finish_reason == "stop"
    assert tokens == thinker.prompts.tokenizer.encode(job.recite, add_special_tokens=False)
    return Recited(outputs, tokens, rows)


async def check_the_caller_is_heard(thinker: AudioThinker, pool: BlockPool, tmp_path: Path,
                                    messages: Messages, tag: str) -> None:
    """Whisper tiny.en hears the utterance the thinker answers: its words come once, before
    the reply's last output, scored for the end of the turn by the thinker's LM when asked; a
    `transcribe` job is the words alone (no engine request). Request ids `call2/...`."""
    speech, _ = read_wav(speech_wav("What is the capital of France?", tmp_path / "q.wav",
                                    rate=16_000, pad_before_s=0.3, pad_after_s=0.3))
    job = ThinkerJob("call2/turn1/thinker", messages, audio=pool.write(speech, 1.0),
                     max_tokens=8, embeds=False, score_end_of_turn=True)
    outputs = [out async for out in thinker.stream(job)]
    (heard,) = [i for i, out in enumerate(outputs) if out.transcript is not None]
    said = outputs[heard]
    assert said.transcript is not None
    words = said.transcript.lower()
    assert "capital" in words and "france" in words, words
    assert said.end_of_turn is not None and 0.0 <= said.end_of_turn <= 1.0
    assert heard < len(outputs) - 1 and outputs[-1].finished
    assert sum(len(out.token_ids) for out in outputs) == 8, "the reply is the thinker's"
    assert all(out.embeds == [] for out in outputs), "a text-only job sends no rows"
    print_figure(tag, "end of turn after a finished question", said.end_of_turn, "")

    job = ThinkerJob("call2/turn2/thinker", messages, audio=pool.write(speech, 1.0),
                     transcribe=True)
    only = [out async for out in thinker.stream(job)]
    assert [out.transcript for out in only] == [said.transcript, None]
    assert only[-1].finished and only[-1].finish_reason == "stop"
    assert not any(out.token_ids for out in only) and thinker.active_request_ids() == []
    assert pool.in_use == 0, "both audio blocks released"


async def check_closing_midway(thinker: AudioThinker, pool: BlockPool, request_id: str,
                               messages: Messages, max_tokens: int) -> None:
    """A stream of a job with audio closed after three outputs leaves no request in the engine
    and no block held: the audio block was released once encoded."""
    held_before = pool.in_use
    job = ThinkerJob(request_id, messages, audio=pool.write(gliding_utterance(1.0), 1.0),
                     max_tokens=max_tokens)
    stream = thinker.stream(job)
    assert isinstance(stream, AsyncGenerator)
    for _ in range(3):
        out = await anext(stream)
        for ref in out.embeds:
            assert isinstance(ref, BlockRef)
            pool.release(ref)
    await stream.aclose()
    assert thinker.active_request_ids() == []
    assert pool.in_use == held_before, "the audio block was released once encoded"
