"""A real aiortc caller: its speech is detected at the right positions, the agent's audio
reaches it, G.711 callers work the same, and bad data-channel messages get error events."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.audio_fixtures import read_wav, speech_bounds, speech_wav
from tests.media_servers import call_of
from tests.product_calls import wait_until
from tests.responder import TONE_HZ
from tests.rtc_client import ArrayAudioTrack, RtcCaller
from tests.served import Served

pytestmark = pytest.mark.asyncio(loop_scope="session")
TOLERANCE_MS = 150
JITTER_BUFFER_FRAMES = 16  # aiortc's audio jitter buffer (capacity 16 packets)


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, int, int]:
    """espeak-ng speech at 48 kHz with 1 s of silence before it: (pcm, start_ms, end_ms)."""
    path = speech_wav(
        "What is the capital of France?",
        Path(tmp_path_factory.mktemp("speech")) / "question.wav",
        pad_before_s=1.0,
        pad_after_s=1.5,
    )
    pcm, rate = read_wav(path)
    assert rate == 48_000
    start_ms, end_ms = speech_bounds(pcm, rate)
    return pcm, start_ms, end_ms


ENCODERS = {(): "VoiceOpusEncoder", ("PCMU",): "PcmuEncoder", ("PCMA",): "PcmaEncoder"}


def dominant_hz(pcm: np.ndarray, rate: int = 48_000) -> float:
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64)))
    return float(np.fft.rfftfreq(len(pcm), 1 / rate)[int(np.argmax(spectrum))])


async def call_and_speak(url: str, pcm: np.ndarray, codecs: tuple[str, ...] = ()) -> RtcCaller:
    caller = RtcCaller(url, ArrayAudioTrack(pcm), codecs=codecs)
    await caller.connect()
    return caller


@pytest.mark.parametrize("codecs", [(), ("PCMU",), ("PCMA",)], ids=["opus", "pcmu", "pcma"])
async def test_speech_detected_at_its_position_and_answered(
    media_server: Served, question: tuple[np.ndarray, int, int], codecs: tuple[str, ...]
) -> None:
    pcm, start_ms, end_ms = question
    caller = await call_and_speak(media_server.url, pcm, codecs)
    try:
        created = await caller.wait_for("session.created")
        assert created["session"]["type"] == "realtime"
        started = await caller.wait_for("input_audio_buffer.speech_started", timeout=15)
        stopped = await caller.wait_for("input_audio_buffer.speech_stopped", timeout=15)
        assert abs(started["audio_start_ms"] - start_ms) <= TOLERANCE_MS, (started, start_ms)
        assert abs(stopped["audio_end_ms"] - end_ms) <= TOLERANCE_MS, (stopped, end_ms)
        assert started["item_id"] == stopped["item_id"]
        assert len(caller.of_type("input_audio_buffer.speech_started")) == 1
        # The test responder plays 1 s of tone once the utterance closes: wait until the
        # server's track has played it out, then until the caller has decoded more frames than
        # its jitter buffer holds, so that every frame sent before then has reached it.
        server_call = call_of(media_server, caller)
        outbound = server_call.outbound
        await wait_until(lambda: outbound.played_ms >= 900 and not outbound.playing
                         and not outbound.queued_ms, 15, "the server to play the tone out")
        received = len(caller.received)
        await wait_until(lambda: len(caller.received) > received + JITTER_BUFFER_FRAMES, 15,
                         "the caller to receive what was in flight")
        heard = caller.received_pcm()
        loud = np.flatnonzero(np.abs(heard) > 1000)
        assert loud.size > 0.5 * 48_000, "the agent's tone did not reach the caller"
        assert abs(dominant_hz(heard[loud[0] : loud[-1]]) - TONE_HZ) < 5
        # The server encoded it itself, for the negotiated codec (media/encoded_audio.py), and
        # stamped the packets 20 ms apart on the codec's clock.
        track = next(s.track for s in server_call.pc.getSenders() if s.kind == "audio")
        assert type(track.encoder).__name__ == ENCODERS[codecs]
        steps = np.diff(caller.received_pts)
        assert steps.size > 100 and np.all(steps == steps[0]) and steps[0] > 0, steps
    finally:
        await caller.hang_up()


async def test_g711_call_negotiates_g711(media_server: Served, question) -> None:
    caller = await call_and_speak(media_server.url, question[0], ("PCMU",))
    try:
        await caller.wait_for("session.created")
        answer = caller.pc.remoteDescription.sdp
        audio = answer[answer.index("m=audio") :]
        assert "PCMU/8000" in audio and "opus" not in audio
    finally:
        await caller.hang_up()


async def test_bad_client_messages_get_errors_and_the_call_goes_on(
    media_server: Served, question
) -> None:
    caller = await call_and_speak(media_server.url, question[0])
    try:
        await caller.wait_for("session.created")
        caller.send("{not json")
        caller.send({"type": "no.such.event", "event_id": "evt_1"})
        caller.send({"type": "session.update", "event_id": "evt_2", "session": {"type": 7}})
        caller.send("[1, 2]")
        errors = [await caller.wait_for("error", count=n) for n in range(1, 5)]
        codes = [e["error"]["code"] for e in errors]
        assert codes == ["invalid_json", "unknown_event", "invalid_event", "invalid_event"]
        assert [e["error"]["event_id"] for e in errors][1:3] == ["evt_1", "evt_2"]
        started = await caller.wait_for("input_audio_buffer.speech_started", timeout=15)
        assert started["audio_start_ms"] > 0
    finally:
        await caller.hang_up()
