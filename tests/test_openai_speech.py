"""`POST /v1/audio/speech` through the official `openai` SDK against the real product on the
tiny family (random weights: the audio is noise, its length and framing are what is checked):
every response format decodes with FFmpeg's decoders to the audio the pipeline rendered,
`stream_format: sse` streams one delta per rendered chunk, bad requests are refused naming the
field, and a client that leaves mid-stream cancels the turn in every engine and frees its slot."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import openai
import pytest

from agent.api.speech import ENGINE
from pipeline.turns.events import Event, Turn
from tests.metrics_samples import Samples, grew, scrape
from tests.openai_clients import clients
from tests.product_calls import held_request_ids, wait_until
from tests.served import Served

pytestmark = pytest.mark.engines

TEXT = "Hello there, how are you today? I hope the weather is kind to you."
RATE = 24_000


def samples_per_token(models_dir: Path) -> int:
    """Samples the tiny VoiceBox renders per speech token (its upsampling factors' product)."""
    config = json.loads((models_dir / "tiny" / "voicebox" / "config.json").read_text())
    return int(np.prod(config["upsample"]))


def decoded_seconds(data: bytes) -> float:
    """The audio's length as FFmpeg decodes the file (any container PyAV reads)."""
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    return sum(f.samples for f in frames) / frames[0].sample_rate


async def test_sse_streams_each_rendered_chunk_and_counts_usage(
        tiny_server: Served, tiny_models_dir: Path) -> None:
    _, client = clients(tiny_server)
    deltas, done = [], None
    async with client.audio.speech.with_streaming_response.create(
            model="tiny", voice="default", input=TEXT, response_format="pcm",
            stream_format="sse") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[len("data: "):])
                if event["type"] == "speech.audio.delta":
                    deltas.append(np.frombuffer(base64.b64decode(event["audio"]), "<i2"))
                else:
                    done = event
    assert done is not None and done["type"] == "speech.audio.done"
    usage = done["usage"]
    # The text's own tokens went in; each speech token is one VoiceBox step of audio.
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    heard = sum(len(d) for d in deltas)
    assert heard == usage["output_tokens"] * samples_per_token(tiny_models_dir)
    # Streamed as rendered: the text's clauses are chunks, each in its own groups of tokens.
    assert len(deltas) >= 3
    assert np.abs(np.concatenate(deltas)).max() > 1000  # not silence


@pytest.mark.parametrize("response_format", ["wav", "pcm", "mp3", "opus", "aac", "flac"])
async def test_each_format_decodes_to_the_rendered_audio(
        tiny_server: Served, tiny_models_dir: Path, response_format: str) -> None:
    sync, _ = clients(tiny_server)
    data = (await asyncio.to_thread(
        sync.audio.speech.create, model="tiny", voice="default", input=TEXT,
        response_format=response_format)).content
    # The tiny Talker speaks a fixed number of tokens per character of each chunk: the length
    # is the same for every request of this text, whatever was sampled.
    expected_s = await rendered_seconds(tiny_server, tiny_models_dir)
    if response_format == "pcm":
        assert len(data) == 2 * round(expected_s * RATE)
        return
    if response_format == "wav":
        with wave.open(io.BytesIO(data)) as wav:
            assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (RATE, 1, 2)
            assert len(wav.readframes(1 << 30)) == 2 * round(expected_s * RATE)
    # Encoders pad to whole frames (and mp3/aac prime their decoders): within 0.1 s.
    assert decoded_seconds(data) == pytest.approx(expected_s, abs=0.1)


async def rendered_seconds(served: Served, models_dir: Path) -> float:
    _, client = clients(served)
    async with client.audio.speech.with_streaming_response.create(
            model="tiny", voice="default", input=TEXT, stream_format="sse") as response:
        lines = [line async for line in response.iter_lines() if line.startswith("data: ")]
    done = json.loads(lines[-1][len("data: "):])
    return done["usage"]["output_tokens"] * samples_per_token(models_dir) / RATE


@pytest.mark.parametrize(("body", "param"), [
    ({"voice": "alloy"}, "voice"),  # the tiny family has the voices "default" and "bright"
    ({"response_format": "ogg"}, "response_format"),
    ({"speed": 1.5}, "speed"),
    ({"input": ""}, "input"),
    ({"input": "x" * 4097}, "input"),
    ({"instructions": "Speak cheerfully."}, "instructions"),  # refused rather than ignored
])
async def test_bad_requests_are_refused_naming_the_field(
        tiny_server: Served, body: dict, param: str) -> None:
    _, client = clients(tiny_server)
    asked = {"model": "tiny", "voice": "default", "input": TEXT, **body}
    with pytest.raises(openai.BadRequestError) as refused:
        await client.audio.speech.create(**asked)
    assert refused.value.body["param"] == param, refused.value.body
    assert tiny_server.app.state.completion_slots.held(ENGINE) == 0


async def test_unknown_model_is_404(tiny_server: Served) -> None:
    _, client = clients(tiny_server)
    with pytest.raises(openai.NotFoundError):
        await client.audio.speech.create(model="nope", voice="default", input=TEXT)


async def test_a_client_that_leaves_mid_stream_cancels_the_turn(
        tiny_server: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = tiny_server.app.state.pipeline
    seen: list[str] = []  # the events the route took from the real pipeline, then "end"
    respond = pipeline.respond

    async def watched(turn: Turn, **options: Any) -> AsyncIterator[Event]:
        async for event in respond(turn, **options):
            seen.append(type(event).__name__)
            yield event
        seen.append("end")

    monkeypatch.setattr(pipeline, "respond", watched)
    long_text = " ".join([TEXT] * 12)  # a minute of speech: seconds to render
    asked = {"model": "tiny", "voice": "default", "input": long_text, "response_format": "pcm"}
    async with (httpx.AsyncClient(base_url=tiny_server.url, timeout=60) as http,
                http.stream("POST", "/v1/audio/speech", json=asked) as response):
        assert response.status_code == 200
        async for _ in response.aiter_bytes():
            break  # the first audio came: leave
    await wait_until(lambda: tiny_server.app.state.completion_slots.held(ENGINE) == 0, 10,
                     "the slot to be given back")
    # The route let go of the turn before its end (leaving the iteration cancels a turn)...
    assert "AudioChunk" in seen and "TurnDone" not in seen and "end" not in seen, seen
    for _ in range(100):  # ... and its requests are aborted in every engine
        if not await held_request_ids(tiny_server):
            break
        await asyncio.sleep(0.1)
    assert await held_request_ids(tiny_server) == []


async def test_answers_are_counted_and_timed_in_metrics(tiny_server: Served) -> None:
    _, client = clients(tiny_server)
    before = await scrape(tiny_server.url)
    spoken = await client.audio.speech.create(model="tiny", voice="default", input="Hi there.",
                                              response_format="pcm")
    assert len(spoken.content) > 0
    with pytest.raises(openai.BadRequestError):
        await client.audio.speech.create(model="tiny", voice="nobody", input="Hi there.")
    after = await scrape(tiny_server.url)
    def answered(samples: Samples, status: str) -> float:  # a status first seen has no sample
        labels = frozenset({("endpoint", "speech"), ("status", status)})
        return samples.get(("omnivox_model_requests_total", labels), 0.0)

    assert answered(after, "200") - answered(before, "200") == 1
    assert answered(after, "400") - answered(before, "400") == 1
    latency = "omnivox_model_answer_latency_seconds"
    assert grew(before, after, f"{latency}_count", endpoint="speech") == 2
    assert grew(before, after, f"{latency}_sum", endpoint="speech") > 0
