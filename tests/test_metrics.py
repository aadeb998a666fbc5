"""/metrics as Prometheus scrapes it, parsed with prometheus_client's own text parser: real calls
on the tiny family move the call, turn, latency, barge-in and cancel metrics; the supervisor's
restart counts, the shared-memory pool and the event-loop monitor are read live; refused offers
and calls that never connect are counted on a media-only server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest

import agent.calls.call
from agent.app import create_app
from agent.config import Settings
from tests.metrics_samples import grew, scrape, value
from tests.product_calls import connect, long_replies, say, spoken, wait_until
from tests.responder import ToneResponder
from tests.rtc_client import dead_peer_offer
from tests.served import Served, serve

pytestmark = pytest.mark.asyncio(loop_scope="session")
STAGES = ("asr", "thinker_first_token", "talker_first_tokens", "voicebox_first_chunk")

@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return spoken("What is the weather like tomorrow?", Path(tmp_path_factory.mktemp("speech")))


@pytest.mark.engines
async def test_a_call_and_its_turn_show_in_metrics(tiny_server: Served) -> None:
    url = tiny_server.url
    before = await scrape(url)
    assert value(before, "omnivox_active_calls") == 0
    caller = await connect(url)
    try:
        during = await scrape(url)
        assert value(during, "omnivox_active_calls") == 1
        assert grew(before, during, "omnivox_calls_started_total") == 1
        say(caller, "Hello, who are you?")
        done = await caller.wait_for("response.done", timeout=90)
        assert done["response"]["status"] == "completed", done
    finally:
        await caller.hang_up()
    await wait_until(lambda: len(tiny_server.app.state.calls) == 0, 10, "the call to end")
    after = await scrape(url)
    assert value(after, "omnivox_active_calls") == 0
    assert grew(before, after, "omnivox_turns_total", outcome="completed") == 1
    assert grew(before, after, "omnivox_turns_total", outcome="failed") == 0

    ttfa = "omnivox_time_to_first_audio_seconds"
    assert grew(before, after, f"{ttfa}_count") == 1
    first_audio_s = grew(before, after, f"{ttfa}_sum")
    # A typed message has no audio to recognise: every stage but ASR answered once.
    latency = "omnivox_stage_latency_seconds"
    counts = {stage: grew(before, after, f"{latency}_count", stage=stage) for stage in STAGES}
    assert counts == {"asr": 0, "thinker_first_token": 1, "talker_first_tokens": 1,
                      "voicebox_first_chunk": 1}
    firsts = [grew(before, after, f"{latency}_sum", stage=stage) for stage in STAGES[1:]]
    # The cascade: the Talker starts from Thinker text, the VoiceBox from speech tokens, and
    # the audio reaches the track after the VoiceBox rendered it.
    assert 0 < firsts[0] <= firsts[1] <= firsts[2] <= first_audio_s, (firsts, first_audio_s)
    print(f"\n[metrics] first text / speech tokens / audio chunk / audio to the track: "
          f"{' / '.join(f'{s * 1000:.0f}' for s in [*firsts, first_audio_s])} ms")

    for stage in ("thinker", "talker", "voicebox"):
        assert value(after, "omnivox_worker_restarts_total", stage=stage) == 0
    blocks = tiny_server.app.state.pipeline.settings.pool.block_count
    assert value(after, "omnivox_shm_blocks") == blocks
    assert 0 <= value(after, "omnivox_shm_blocks_in_use") < blocks

    # The event-loop monitor keeps sampling while the server runs; its last minute's p99 (a
    # gauge) is a lateness it measured: above zero (no wake-up is early), and within the
    # histogram's bucket that holds every sample so far.
    lag = "omnivox_event_loop_lag_seconds"
    assert value(after, f"{lag}_count") > value(before, f"{lag}_count") > 0
    every = min(float(dict(labels)["le"]) for (name, labels), n in after.items()
                if name == f"{lag}_bucket" and n == value(after, f"{lag}_count"))
    assert 0 < value(after, "omnivox_event_loop_lag_p99_seconds") <= every


@pytest.mark.engines
async def test_barge_in_and_cancel_are_counted(tiny_server: Served, question: np.ndarray
                                               ) -> None:
    url = tiny_server.url
    before = await scrape(url)
    caller = await connect(url, question)
    try:
        long_replies(caller)  # still generating when the caller talks over it
        await caller.wait_for("output_audio_buffer.started", timeout=90)
        caller.audio.replace(question[int(0.4 * 48_000):])
        cut = await caller.wait_for("response.done", timeout=60)
        assert cut["response"]["status"] == "cancelled"
        # The new utterance gets a (long) reply of its own; the caller cancels that one.
        await caller.wait_for("output_audio_buffer.started", count=2, timeout=90)
        caller.send({"type": "response.cancel"})
        cancelled = await caller.wait_for("response.done", count=2, timeout=60)
        assert cancelled["response"]["status"] == "cancelled"
    finally:
        await caller.hang_up()
    after = await scrape(url)
    assert grew(before, after, "omnivox_barge_ins_total") == 1
    assert grew(before, after, "omnivox_cancels_total", reason="turn_detected") == 1
    assert grew(before, after, "omnivox_cancels_total", reason="client_cancelled") == 1
    assert grew(before, after, "omnivox_turns_total", outcome="cancelled") == 2
    assert grew(before, after, "omnivox_turns_total", outcome="completed") == 0


@pytest.fixture(scope="module")
async def one_call_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """A media-only server with room for one call (its own app, its own registry)."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("data"), max_calls=1)
    async with serve(create_app(settings, handler_factory=ToneResponder)) as served:
        yield served


async def test_refused_calls_are_counted(one_call_server: Served) -> None:
    url = one_call_server.url
    before = await scrape(url)
    first = await connect(url)
    try:
        second_offer = await dead_peer_offer()
        async with httpx.AsyncClient(base_url=url, timeout=15) as http:
            refused = await http.post("/v1/realtime/calls", content=second_offer,
                                      headers={"Content-Type": "application/sdp"})
        assert refused.status_code == 503
        during = await scrape(url)
        assert value(during, "omnivox_active_calls") == 1
        assert grew(before, during, "omnivox_calls_refused_total", reason="too_many_calls") == 1
        assert grew(before, during, "omnivox_calls_started_total") == 1
    finally:
        await first.hang_up()
    await wait_until(lambda: len(one_call_server.app.state.calls) == 0, 10, "the hang-up")
    assert value(await scrape(url), "omnivox_active_calls") == 0


async def test_a_call_that_never_connects_is_counted_dropped(
    one_call_server: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent.calls.call, "CONNECT_TIMEOUT_S", 1.0)  # the watchdog: 30 s
    url = one_call_server.url
    before = await scrape(url)
    async with httpx.AsyncClient(base_url=url, timeout=15) as http:
        answered = await http.post("/v1/realtime/calls", content=await dead_peer_offer(),
                                   headers={"Content-Type": "application/sdp"})
    assert answered.status_code == 201, answered.text  # answered, but no peer will ever connect
    await wait_until(lambda: len(one_call_server.app.state.calls) == 0, 20, "the watchdog")
    after = await scrape(url)
    assert grew(before, after, "omnivox_calls_dropped_total", reason="connect_timeout") == 1
    assert value(after, "omnivox_active_calls") == 0


