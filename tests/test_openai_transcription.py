"""`POST /v1/audio/transcriptions` (and `/v1/audio/speech` on real voices) through the official
`openai` SDK against the real product on the local profile (Whisper tiny.en, the Piper voice):
an espeak-ng question is transcribed from a WAV file in every response format, the server's own
speech is understood when transcribed back (a round trip through two endpoints and two codecs),
and what cannot be honoured is refused naming the field. A Realtime transcription session
(`session.type: "transcription"`) writes a caller's question down and answers nothing. The tiny
family, which hears without writing down, refuses transcriptions of both kinds."""

from __future__ import annotations

import asyncio
import io
import re
import wave
from pathlib import Path

import jiwer
import numpy as np
import openai
import pytest

from tests.audio_fixtures import read_wav, speech_wav, write_wav
from tests.openai_clients import clients
from tests.product_calls import assert_valid_events, connect
from tests.served import Served

pytestmark = pytest.mark.engines

QUESTION = "What is the capital of France?"
SENTENCE = "The weather is sunny and warm today."


# Contractions Whisper may write for the words said ("The weather is" heard as "the
# weather's"): the same words, not two errors.
CONTRACTIONS = ((r"(\w)'s\b", r"\1 is"), (r"(\w)'re\b", r"\1 are"), (r"n't\b", " not"),
                (r"(\w)'m\b", r"\1 am"), (r"(\w)'ll\b", r"\1 will"))


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate, case, punctuation and contractions aside."""
    def words(text: str) -> str:
        text = text.lower()
        for pattern, replacement in CONTRACTIONS:
            text = re.sub(pattern, replacement, text)
        return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text).split())
    return jiwer.wer(words(reference), words(hypothesis))


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = speech_wav(QUESTION, tmp_path_factory.mktemp("speech") / "question.wav",
                      rate=16_000, pad_before_s=0.3, pad_after_s=0.3)
    return path.read_bytes()


async def test_a_spoken_question_is_transcribed_in_each_format(
        local_server: Served, question_wav: bytes) -> None:
    _, client = clients(local_server)
    plain = await client.audio.transcriptions.create(model="local",
                                                     file=("question.wav", question_wav))
    assert wer(QUESTION, plain.text) <= 0.2, plain.text
    assert plain.usage is not None and plain.usage.seconds == 3  # 2.4 s of speech and silence
    text = await client.audio.transcriptions.create(
        model="local", file=("question.wav", question_wav), response_format="text")
    assert text.strip() == plain.text  # the same recogniser, greedy: the same words
    verbose = await client.audio.transcriptions.create(
        model="local@1", file=("question.wav", question_wav), response_format="verbose_json",
        language="en")
    assert verbose.text == plain.text and verbose.language == "english"
    with wave.open(io.BytesIO(question_wav)) as wav:
        seconds = wav.getnframes() / wav.getframerate()
    assert verbose.duration == pytest.approx(seconds, abs=0.01)


@pytest.mark.parametrize("response_format", ["mp3", "opus"])
async def test_the_servers_own_speech_is_understood(local_server: Served,
                                                    response_format: str) -> None:
    """Spoken by /v1/audio/speech (the Piper voice), heard by /v1/audio/transcriptions."""
    sync, client = clients(local_server)
    spoken = (await asyncio.to_thread(
        sync.audio.speech.create, model="local", voice="default", input=SENTENCE,
        response_format=response_format)).content
    heard = await client.audio.transcriptions.create(
        model="local", file=(f"speech.{response_format}", spoken))
    print(f"\n[speech -> transcription, {response_format}] {heard.text!r}")
    assert wer(SENTENCE, heard.text) <= 0.2, heard.text


@pytest.mark.parametrize(("fields", "param"), [
    ({"response_format": "srt"}, "response_format"),
    ({"language": "fr"}, "language"),  # Whisper tiny.en hears English only
    ({"prompt": "Earlier: Paris."}, "prompt"),  # refused rather than ignored
    ({"temperature": "0.7"}, "temperature"),
])
async def test_what_cannot_be_honoured_is_refused(local_server: Served, question_wav: bytes,
                                                  fields: dict, param: str) -> None:
    _, client = clients(local_server)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.audio.transcriptions.create(model="local",
                                                 file=("q.wav", question_wav), **fields)
    assert refused.value.body["param"] == param, refused.value.body


async def test_a_file_that_is_not_audio_or_too_long_is_refused(local_server: Served,
                                                               tmp_path: Path) -> None:
    _, client = clients(local_server)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.audio.transcriptions.create(model="local", file=("q.wav", b"not audio"))
    assert refused.value.body["param"] == "file"
    block = local_server.app.state.pipeline.settings.pool.block_size
    long = write_wav(tmp_path / "long.wav", np.zeros(block // 2 + 16_000, np.int16), 16_000)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.audio.transcriptions.create(model="local", file=long)
    assert refused.value.body["param"] == "file" and "longer than" in refused.value.message


async def test_a_family_that_does_not_write_speech_down_refuses(tiny_server: Served,
                                                                question_wav: bytes) -> None:
    _, client = clients(tiny_server)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.audio.transcriptions.create(model="tiny", file=("q.wav", question_wav))
    assert refused.value.body["param"] == "model"


TRANSCRIPTION_SESSION = {"type": "session.update", "session": {
    "type": "transcription", "audio": {"input": {
        "transcription": {"model": "gpt-4o-transcribe"},
        "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}}}


async def test_a_transcription_session_writes_the_caller_down_and_answers_nothing(
        local_server: Served, tmp_path: Path) -> None:
    spoken = speech_wav(QUESTION, tmp_path / "question.wav", pad_before_s=0.5, pad_after_s=1.5)
    caller = await connect(local_server.url)
    try:
        caller.send(TRANSCRIPTION_SESSION)
        session = (await caller.wait_for("session.updated"))["session"]
        assert session["type"] == "transcription"
        assert session["audio"]["input"]["transcription"]["model"] == "local@1"
        caller.audio.replace(read_wav(spoken)[0])
        committed = await caller.wait_for("input_audio_buffer.committed", timeout=30)
        completed = await caller.wait_for(
            "conversation.item.input_audio_transcription.completed", timeout=60)
        assert completed["item_id"] == committed["item_id"]
        assert wer(QUESTION, completed["transcript"]) <= 0.2, completed["transcript"]
        (delta,) = caller.of_type("conversation.item.input_audio_transcription.delta")
        assert delta["delta"] == completed["transcript"]
        assert [e["item"]["id"] for e in caller.of_type("conversation.item.done")] == [
            committed["item_id"]]
        caller.send({"type": "response.create", "event_id": "evt_answer"})
        error = (await caller.wait_for("error"))["error"]
        assert (error["code"], error["event_id"]) == ("unsupported_event", "evt_answer")
        assert not caller.of_type("response.created")  # nothing answered, ever
        assert_valid_events(caller)
    finally:
        await caller.hang_up()


async def test_a_family_that_does_not_write_speech_down_has_no_transcription_sessions(
        tiny_server: Served) -> None:
    caller = await connect(tiny_server.url)
    try:
        caller.send(TRANSCRIPTION_SESSION)
        error = (await caller.wait_for("error"))["error"]
        assert error["param"] == "session.type" and "does not write speech down" in error[
            "message"], error
        assert not caller.of_type("session.updated")
    finally:
        await caller.hang_up()
