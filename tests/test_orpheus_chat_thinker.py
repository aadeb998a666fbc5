"""The `orpheus` profile with a text chat model as its Thinker: the checkpoint's thinker/ is
SmolLM2-135M-Instruct (the local family's build), so the caller's audio is heard by Whisper
tiny.en first, the model answers through its own chat template, and the (random-weight) Orpheus
Talker voices the reply. Run by `make soak` (OMNIVOX_ORPHEUS_CHAT_THINKER=1): two engine starts,
about a minute and a half on two cores, too long for `make test`, where
test_architecture_calls.py serves the default (Qwen2.5-Omni) Thinker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.config import Settings
from agent.profiles import build_pipeline, load_profiles
from pipeline.families.local import build_local
from pipeline.families.local.build import LLM_DIR
from pipeline.families.orpheus import build_orpheus
from pipeline.families.orpheus.release import SNAC, TALKER, THINKER
from pipeline.turns.events import AudioChunk, Transcript, Turn, TurnDone
from tests.audio_fixtures import read_wav, speech_wav
from tests.conftest import local_models_dir

pytestmark = [pytest.mark.engines, pytest.mark.skipif(
    not os.environ.get("OMNIVOX_ORPHEUS_CHAT_THINKER"),
    reason="make soak runs it (OMNIVOX_ORPHEUS_CHAT_THINKER=1)")]


def chat_checkpoint(folder: Path) -> Path:
    """An orpheus checkpoint: the tiny talker/ and snac/, and SmolLM2 as thinker/."""
    built = build_orpheus(folder / "built", progress=False)
    local = build_local(local_models_dir(), progress=False)
    checkpoint = folder / "checkpoint"
    checkpoint.mkdir()
    for part in (TALKER, SNAC):
        (checkpoint / part).symlink_to(built / part)
    (checkpoint / THINKER).symlink_to(local / LLM_DIR)
    return checkpoint


async def test_a_chat_model_thinker_hears_through_the_recognizer_and_answers(
    tmp_path: Path,
) -> None:
    settings = Settings(profile="orpheus", models_dir=tmp_path / "models",
                        model_path=chat_checkpoint(tmp_path), data_dir=tmp_path / "data")
    talker = load_profiles()["orpheus-tiny"]["stages"]["talker"]  # random weights' settings
    stages = {"thinker": {"engine": {"cpu_cores": "0"}}, "talker": talker}
    audio, _ = read_wav(speech_wav("What is the capital of France?", tmp_path / "q.wav",
                                   rate=16_000, pad_before_s=0.3, pad_after_s=0.3))
    heard, done, audio_chunks = None, None, 0
    async with build_pipeline(settings, {"stages": stages}) as pipe:
        async for event in pipe.respond(Turn("chat-thinker", [], audio=audio, max_tokens=32)):
            if isinstance(event, Transcript):
                heard = event.text
            elif isinstance(event, AudioChunk):
                audio_chunks += 1
            elif isinstance(event, TurnDone):
                done = event
    assert heard is not None and "capital of france" in heard.lower()
    assert done is not None and "paris" in done.text.lower(), done
    assert audio_chunks > 0 and done.usage["speech_tokens"] > 0
