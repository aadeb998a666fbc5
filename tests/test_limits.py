"""Per-server and per-call limits on real calls: the call cap answers 503 with Retry-After, a
call is ended (final `error` event, then hung up) at its maximum duration or when idle, the data
channel has a size and a rate limit, and a caller flooding audio and events cannot grow the
server's memory (measured on a server in its own process) and still has a working call after."""

from __future__ import annotations

import asyncio
import fractions
import json
import re
import time
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import psutil
import pytest
from aiortc.mediastreams import MediaStreamError
from aiortc.rtcrtpreceiver import RemoteStreamTrack

from agent.calls.limits import TokenBucket
from agent.config import Settings
from media.aiortc_internals import data_channel_backlog, remote_track_queue
from media.inbound import MAX_BACKLOG_FRAMES, InboundAudio
from tests.audio_fixtures import read_wav, speech_wav
from tests.media_servers import responder_of, server_process, tone_server
from tests.product_calls import wait_until
from tests.rtc_client import ArrayAudioTrack, RtcCaller

RATE = 48_000


@pytest.fixture(scope="module")
def sentence(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """About two seconds of espeak-ng speech after one second of silence, 48 kHz."""
    path = speech_wav("Please tell me the opening hours of the library.",
                      tmp_path_factory.mktemp("speech") / "sentence.wav",
                      pad_before_s=1.0, pad_after_s=0.5)
    return read_wav(path)[0]


def settings(data_dir: Path, **fields: Any) -> Settings:
    return Settings(data_dir=data_dir, **fields)


def silence() -> ArrayAudioTrack:
    return ArrayAudioTrack(np.zeros(0, np.int16))


async def connected(url: str, track: ArrayAudioTrack | None = None) -> RtcCaller:
    caller = RtcCaller(url, track or silence())
    await caller.connect()
    await caller.wait_for("session.created", timeout=20)
    return caller



def arrived(caller: RtcCaller, event: dict) -> float:
    """When the caller received `event` (monotonic seconds)."""
    return next(t for t, e in caller.events if e is event)


def clear_event(event_id: str) -> dict:
    return {"type": "input_audio_buffer.clear", "event_id": event_id}


# -- unit: the token bucket ------------------------------------------------------------------


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=4.0, burst=3, clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    now[0] += 0.25  # one token's worth
    assert bucket.take() and not bucket.take()
    now[0] += 100.0  # a long pause saves up no more than the burst
    assert sum(bucket.take() for _ in range(10)) == 3
    with pytest.raises(ValueError):
        TokenBucket(rate=0, burst=1)


# -- calls per server -------------------------------------------------------------------------


async def test_call_cap_answers_503_with_retry_after_and_frees_on_hang_up(tmp_path: Path) -> None:
    async with tone_server(settings(tmp_path, max_calls=1)) as served:
        first = await connected(served.url)
        try:
            second = RtcCaller(served.url, silence())
            try:
                second.pc.addTransceiver(second.audio, direction="sendrecv")
                await second.pc.setLocalDescription(await second.pc.createOffer())
                async with httpx.AsyncClient(base_url=served.url, timeout=15) as http:
                    refused = await http.post(
                        "/v1/realtime/calls", content=second.pc.localDescription.sdp,
                        headers={"Content-Type": "application/sdp"})
            finally:
                await second.close()
            assert refused.status_code == 503
            assert refused.headers["retry-after"].isdigit()
            assert refused.headers["content-type"].startswith("application/json")
            assert refused.json()["error"]["code"] == "too_many_calls"
            assert len(served.app.state.calls) == 1
        finally:
            await first.hang_up()
        third = await connected(served.url)  # the hang-up made room
        await third.hang_up()


# -- call duration and idleness ---------------------------------------------------------------


async def test_call_is_ended_at_its_maximum_duration(tmp_path: Path) -> None:
    async with tone_server(settings(tmp_path, max_call_s=3, idle_timeout_s=600)) as served:
        began = time.monotonic()
        caller = await connected(served.url)
        try:
            sent = 0
            while caller.channel.readyState == "open" and not caller.of_type("error"):
                caller.send(clear_event(f"evt_{sent}"))  # an active caller: 10 messages a second
                sent += 1
                assert sent < 300, "the call was not ended"
                await asyncio.sleep(0.1)
            ended = await caller.wait_for("error", timeout=10)
            assert ended["error"]["code"] == "call_duration_exceeded", ended
            assert "3 s" in ended["error"]["message"]
            assert arrived(caller, ended) - began >= 3.0
            await wait_until(lambda: len(served.app.state.calls) == 0, 10, "the call to end")
            await wait_until(lambda: caller.channel.readyState == "closed", 15,
                             "the caller's data channel to close")
            # The caller was active all along: this was the duration cap, not idleness.
            codes = {e["error"]["code"] for e in caller.of_type("error")}
            assert codes == {"call_duration_exceeded"}
        finally:
            await caller.close()


async def test_idle_call_is_ended_and_activity_defers_it(tmp_path: Path) -> None:
    async with tone_server(settings(tmp_path, idle_timeout_s=2, max_call_s=600)) as served:
        caller = await connected(served.url)
        try:
            for n in range(20):  # 3 s of messages, each well inside the idle timeout
                caller.send(clear_event(f"evt_{n}"))
                await asyncio.sleep(0.15)
            last_sent = time.monotonic()
            assert caller.channel.readyState == "open" and not caller.of_type("error")
            ended = await caller.wait_for("error", timeout=20)
            assert ended["error"]["code"] == "idle_timeout"
            assert arrived(caller, ended) - last_sent >= 2.0 - 0.2  # the server saw it a bit later
            await wait_until(lambda: len(served.app.state.calls) == 0, 10, "the call to end")
            await wait_until(lambda: caller.channel.readyState == "closed", 15,
                             "the caller's data channel to close")
        finally:
            await caller.close()


async def test_caller_speech_and_agent_audio_count_as_activity(
    sentence: np.ndarray, tmp_path: Path
) -> None:
    """Idle after 2 s, but the caller speaks from 1 s to about 3 s and the agent's one-second
    tone follows: the call is ended 2 s after the tone, never in the middle of the turn."""
    async with tone_server(settings(tmp_path, idle_timeout_s=2, max_call_s=600)) as served:
        caller = await connected(served.url, ArrayAudioTrack(sentence))
        try:
            stopped = await caller.wait_for("input_audio_buffer.speech_stopped", timeout=20)
            ended = await caller.wait_for("error", timeout=20)
            assert ended["error"]["code"] == "idle_timeout"
            # The tone (1 s) started after speech_stopped; idleness counts from its end.
            assert arrived(caller, ended) - arrived(caller, stopped) >= 2.0 + 1.0 - 0.5
            assert stopped["audio_end_ms"] > 2_000  # the speech outlasted one idle timeout
        finally:
            await caller.close()


# -- the data channel: size and rate ----------------------------------------------------------


async def test_oversized_messages_are_refused_by_their_utf8_size(tmp_path: Path) -> None:
    async with tone_server(settings(tmp_path, max_event_bytes=1000)) as served:
        caller = await connected(served.url)
        try:
            caller.send({"type": "session.update", "event_id": "evt_big",
                         "session": {"type": "realtime", "instructions": "x" * 2000}})
            # 400 characters but 1,200 bytes of UTF-8.
            caller.send({"type": "session.update", "event_id": "evt_wide",
                         "session": {"type": "realtime", "instructions": "€" * 400}})
            caller.send(clear_event("evt_small"))
            errors = [await caller.wait_for("error", count=n) for n in (1, 2)]
            assert [e["error"]["code"] for e in errors] == ["message_too_large"] * 2
            responder = responder_of(served, caller)
            await wait_until(lambda: responder.client_events, 10, "the small event")
            assert [e.event_id for e in responder.client_events] == ["evt_small"]
        finally:
            await caller.hang_up()


async def test_messages_over_the_rate_are_dropped_with_errors(tmp_path: Path) -> None:
    rate, burst = 5.0, 10
    limits = settings(tmp_path, max_events_per_s=rate, max_event_burst=burst)
    async with tone_server(limits) as served:
        caller = await connected(served.url)
        try:
            responder = responder_of(served, caller)
            began = time.monotonic()
            for n in range(60):
                caller.send(clear_event(f"evt_{n}"))
            await caller.wait_for("error", timeout=10)
            await asyncio.sleep(1.0)  # refills a token or more
            caller.send(clear_event("evt_last"))  # ordered channel: after all 60
            await wait_until(lambda: any(e.event_id == "evt_last" for e in responder.client_events),
                             15, "the event after the flood")
            elapsed = time.monotonic() - began
            accepted = len(responder.client_events) - 1
            assert burst <= accepted <= burst + rate * elapsed, (accepted, elapsed)
            errors = caller.of_type("error")
            assert {e["error"]["code"] for e in errors} == {"rate_limit_exceeded"}
            assert len(errors) <= 5 + 1.0 * elapsed + 1  # refusals are rate-limited as well
            reported = sum(int(re.search(r"(\d+) dropped", e["error"]["message"]).group(1))
                           for e in errors)
            assert 0 < reported <= 60 - accepted
        finally:
            await caller.hang_up()


# -- bounded queues -------------------------------------------------------------------------


def audio_frame(n: int, samples: int = 960) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(np.zeros((1, samples * 2), np.int16), format="s16",
                                       layout="stereo")
    frame.sample_rate = RATE
    frame.pts = n * samples
    frame.time_base = fractions.Fraction(1, RATE)
    return frame


async def test_inbound_backlog_is_bounded(tmp_path: Path) -> None:
    """aiortc's decoded-frame queue is unbounded: a backlog past the cap loses its oldest
    frames instead of growing, and the track's end still arrives."""
    track = RemoteStreamTrack(kind="audio")
    frames = remote_track_queue(track)
    assert frames is not None
    for n in range(4 * MAX_BACKLOG_FRAMES):
        frames.put_nowait(audio_frame(n))
    frames.put_nowait(None)
    inbound = InboundAudio(track, lambda frame: None)
    await asyncio.wait_for(inbound.run(), 30)
    assert inbound.frames_dropped >= 4 * MAX_BACKLOG_FRAMES - MAX_BACKLOG_FRAMES
    assert inbound.frames_in + inbound.frames_dropped == 4 * MAX_BACKLOG_FRAMES
    with pytest.raises(MediaStreamError):
        await track.recv()


class FloodTrack(ArrayAudioTrack):
    """Plays `pcm` in a loop: as fast as aiortc can encode and send while flooding, else at
    real-time pace."""

    def __init__(self, pcm: np.ndarray) -> None:
        super().__init__(pcm)
        self.flooding = False
        self.flooded = 0  # frames sent while flooding

    async def recv(self) -> av.AudioFrame:
        if not self.flooding:
            return await super().recv()
        await asyncio.sleep(0)
        if self._pos >= len(self._pcm):
            self._pos = 0
        chunk = self._pcm[self._pos:self._pos + self.samples_per_frame]
        self._pos += self.samples_per_frame
        chunk = np.pad(chunk, (0, self.samples_per_frame - len(chunk)))
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.rate
        frame.pts = self._n * self.samples_per_frame
        frame.time_base = fractions.Fraction(1, self.rate)
        self._n += 1
        self.flooded += 1
        # Real-time pacing resumes from now when the flood ends, not from the first frame.
        self._start = asyncio.get_running_loop().time() - self._n * 0.02
        return frame


async def test_audio_and_event_floods_do_not_grow_server_memory(
    sentence: np.ndarray, tmp_path: Path
) -> None:
    flood_s, messages, message_bytes = 6.0, 1000, 16_000
    with server_process(data_dir=str(tmp_path)) as (url, process):
        server = psutil.Process(process.pid)
        track = FloodTrack(sentence)
        caller = await connected(url, track)
        try:
            # Warm up: one real turn, so decoders, resamplers and buffers exist before the baseline.
            await caller.wait_for("input_audio_buffer.speech_stopped", timeout=20)
            baseline = server.memory_info().rss
            peak = baseline

            async def sample_rss(seconds: float) -> None:
                nonlocal peak
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    peak = max(peak, server.memory_info().rss)
                    await asyncio.sleep(0.1)

            track.flooding = True
            event = json.dumps({"type": "session.update", "session": {
                "type": "realtime", "instructions": "x" * message_bytes}})
            for _ in range(messages):
                caller.send(event)
            await sample_rss(flood_s)
            track.flooding = False
            while data_channel_backlog(caller.channel):
                await sample_rss(0.5)  # until the server has taken every message
            await sample_rss(1.0)
            growth = peak - baseline
            sent = track.flooded * 20 / 1000
            print(f"\n[limits] flood: {sent:.0f} s of audio in {flood_s:.0f} s and "
                  f"{messages * message_bytes / 2**20:.1f} MiB of events; server RSS "
                  f"{baseline / 2**20:.0f} MiB -> peak +{growth / 2**20:.1f} MiB")
            assert sent > 2 * flood_s  # it did send faster than real time
            # Less than what was sent: 16 MB of events and, decoded at 48 kHz stereo, the audio.
            assert growth < 12 * 2**20
            refused = [e for e in caller.of_type("error")
                       if e["error"]["code"] == "rate_limit_exceeded"]
            assert refused, "a flood of events must be refused"

            # The call still works: speech is heard and a message answered.
            track.replace(sentence)
            speeches = len(caller.of_type("input_audio_buffer.speech_stopped"))
            await caller.wait_for("input_audio_buffer.speech_stopped", timeout=30,
                                  count=speeches + 1)
            errors = len(caller.of_type("error"))
            caller.send("{not json")
            answer = await caller.wait_for("error", timeout=15, count=errors + 1)
            assert answer["error"]["code"] == "invalid_json"
        finally:
            await caller.hang_up()

