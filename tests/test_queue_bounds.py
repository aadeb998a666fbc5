"""The queue bounds of docs/operations.md, on real calls (real aiortc callers, real servers):

- server events waiting for the data channel to open: 256, the oldest dropped;
- utterances not yet answered (create_response false): 4, the oldest dropped;
- agent audio queued for playback (`outbound_queue_ms`): a writer waits (back-pressure) while
  the queue is full, and every sample it wrote is played in the end.

(The decoded caller audio's bound, 5 s, is tests/test_limits.py's.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from agent.app import create_app
from agent.calls.call import EVENTS_CHANNEL, PENDING_EVENTS_MAX
from agent.config import Settings
from agent.realtime.server_events import error_event
from agent.realtime.session import UNANSWERED_MAX
from media.vad import SpeechStopped
from pipeline.turns.orchestrator import Pipeline
from tests.audio_fixtures import read_wav, speech_wav, tone
from tests.fake_family import FAKE_PIPELINE
from tests.media_servers import call_of, tone_server
from tests.product_calls import turn_detection, update_session, wait_until
from tests.rtc_client import ArrayAudioTrack, RtcCaller
from tests.served import Served, serve

WAIT_S = 30.0  # only keeps a broken test from hanging


# -- events waiting for the data channel ------------------------------------------------------


async def test_events_before_the_data_channel_opens_keep_the_latest_256(tmp_path: Path) -> None:
    """The caller's SCTP association is up (it opened another channel first), but not the
    `oai-events` channel: 300 server events wait, bounded. Once the caller opens the channel it
    gets `session.created`, then the latest 256 of them in order, then what follows live."""
    assert PENDING_EVENTS_MAX == 256
    extra = 44
    async with tone_server(Settings(data_dir=tmp_path)) as served:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        got: list[dict[str, Any]] = []
        try:
            pc.addTransceiver(ArrayAudioTrack(np.zeros(0, np.int16)), direction="sendrecv")
            other = pc.createDataChannel("other")  # brings SCTP up without oai-events
            await pc.setLocalDescription(await pc.createOffer())
            async with httpx.AsyncClient(base_url=served.url, timeout=15) as http:
                answered = await http.post("/v1/realtime/calls", content=pc.localDescription.sdp,
                                           headers={"Content-Type": "application/sdp"})
            assert answered.status_code == 201, answered.text
            await pc.setRemoteDescription(RTCSessionDescription(answered.text, "answer"))
            await wait_until(lambda: other.readyState == "open", WAIT_S, "SCTP to come up")
            call = served.app.state.calls.get(answered.headers["location"].rsplit("/", 1)[1])
            for n in range(PENDING_EVENTS_MAX + extra):
                call.send_event(error_event(f"pending {n}", code=f"n{n}"))

            channel = pc.createDataChannel(EVENTS_CHANNEL)
            channel.on("message", lambda m: got.append(json.loads(m)))
            await wait_until(lambda: len(got) >= 1 + PENDING_EVENTS_MAX, WAIT_S,
                             "the pending events")
            call.send_event(error_event("live", code="live"))
            await wait_until(lambda: got[-1].get("error", {}).get("code") == "live", WAIT_S,
                             "the live event")
        finally:
            await pc.close()
    assert got[0]["type"] == "session.created"
    codes = [e["error"]["code"] for e in got[1:]]
    assert codes == [f"n{n}" for n in range(extra, PENDING_EVENTS_MAX + extra)] + ["live"]


# -- agent audio queued for playback ----------------------------------------------------------


async def test_agent_audio_beyond_outbound_queue_ms_waits_for_playback(tmp_path: Path) -> None:
    """Three seconds of agent audio written into a call whose queue holds 0.5 s: the write
    returns only once all but the last 0.5 s has been played (counted on the stream's clock),
    the queue never holds more than its bound, and the caller hears all of it."""
    queue_ms, audio_s = 500, 3.0
    async with tone_server(Settings(data_dir=tmp_path, outbound_queue_ms=queue_ms)) as served:
        caller = RtcCaller(served.url, ArrayAudioTrack(np.zeros(0, np.int16)))
        try:
            await caller.connect()
            await caller.wait_for("session.created", timeout=WAIT_S)
            outbound = call_of(served, caller).outbound
            peak = 0

            async def watch() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, outbound.queued_ms)
                    await asyncio.sleep(0.005)

            watcher = asyncio.create_task(watch())
            played_before = outbound.played_ms
            await outbound.write(tone(440, audio_s, 24_000, 0.3), 24_000)
            played_at_return = outbound.played_ms - played_before
            await wait_until(lambda: not outbound.queued_ms and not outbound.playing, WAIT_S,
                             "the rest to play out")
            watcher.cancel()
            assert peak <= queue_ms, peak
            # Back-pressure: the write waited for playback to make room.
            assert played_at_return >= audio_s * 1000 - queue_ms, played_at_return
            assert outbound.played_ms - played_before >= audio_s * 1000 - 20
            await wait_until(lambda: loud_ms(caller) >= audio_s * 1000 - 100, WAIT_S,
                             "the caller to hear the whole tone")
        finally:
            await caller.hang_up()


def loud_ms(caller: RtcCaller) -> int:
    return sum(caller.loud_bursts(300))


# -- unanswered utterances --------------------------------------------------------------------

@pytest.fixture(scope="module")
async def fake_family_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """The product's conversation sessions on the fake family (real workers, trivial models):
    its Thinker's transcript of an utterance is `<N samples>`, the audio it was given."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("data"))
    app = create_app(settings, pipeline=Pipeline(FAKE_PIPELINE))
    async with serve(app) as served:
        await wait_until(lambda: app.state.readiness.ready(), 120, "the fake stages")
        yield served


@pytest.fixture(scope="module")
def six_utterances(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    word = read_wav(speech_wav("hello", tmp_path_factory.mktemp("speech") / "hello.wav",
                               pad_before_s=0.3, pad_after_s=0.0))[0]
    gap = np.zeros(48_000, np.int16)  # 1 s: past the VAD's 500 ms of silence
    return np.concatenate([gap] + [np.concatenate([word, gap]) for _ in range(6)])


async def test_only_the_latest_four_unanswered_utterances_are_heard(
    fake_family_server: Served, six_utterances: np.ndarray
) -> None:
    """With create_response false the caller says six things, then asks for a response: the
    reply hears the last four utterances (its Thinker is given their audio, one after another,
    and says how many samples it got), not all six."""
    assert UNANSWERED_MAX == 4
    served = fake_family_server
    track = ArrayAudioTrack(np.zeros(0, np.int16))
    caller = RtcCaller(served.url, track)
    try:
        await caller.connect()
        await caller.wait_for("session.created", timeout=WAIT_S)
        update_session(caller, audio=turn_detection(create_response=False))
        await caller.wait_for("session.updated", timeout=WAIT_S)
        session = call_of(served, caller).handler
        heard: list[tuple[str, int]] = []  # what the VAD handed the session, in order
        on_speech_stopped = session.on_speech_stopped

        def spy(event: SpeechStopped, item_id: str) -> None:
            heard.append((item_id, len(event.pcm)))
            on_speech_stopped(event, item_id)

        session.on_speech_stopped = spy  # the call looks it up on each utterance
        track.replace(six_utterances)
        await caller.wait_for("input_audio_buffer.committed", timeout=60, count=6)
        assert not caller.of_type("response.created")  # nothing answered yet
        assert [e["item_id"] for e in caller.of_type("input_audio_buffer.committed")] == [
            item for item, _ in heard]
        caller.send({"type": "response.create"})
        done = await caller.wait_for("response.done", timeout=WAIT_S)
        assert done["response"]["status"] == "completed", done
        transcript = await caller.wait_for(
            "conversation.item.input_audio_transcription.completed", timeout=WAIT_S)
        kept = heard[-UNANSWERED_MAX:]
        assert transcript["item_id"] == kept[-1][0]
        assert transcript["transcript"] == f"<{sum(n for _, n in kept)} samples>", (
            transcript, heard)
        assert sum(n for _, n in kept) < sum(n for _, n in heard)
    finally:
        await caller.hang_up()
