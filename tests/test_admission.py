"""Admission control on measured load: a call plane whose event loop runs late (or whose calls'
audio frames leave late, or whose thread waits for a CPU) refuses new calls at once (503
`server_busy`, `Retry-After`, /readyz `full`) while the live calls go on, and takes calls again
once the load is gone."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from agent.config import Settings
from media.pacing import pacing_lateness
from pipeline.runtime import schedstat
from tests.media_servers import tone_server
from tests.product_calls import wait_until
from tests.rtc_client import ArrayAudioTrack, RtcCaller
from tests.served import Served

WINDOW_S = 2.0
LAG_LIMIT_MS = 100.0


def admitting(tmp_path: Path, **limits: float) -> Settings:
    """Settings with the given checks; the pacing check is off unless given."""
    limits.setdefault("admission_max_pacing_late_ms", 0)
    return Settings(data_dir=tmp_path, admission_window_s=WINDOW_S, **limits)


async def offer(url: str) -> httpx.Response:
    """POST a real aiortc offer; the peer is closed whatever the answer."""
    caller = RtcCaller(url, ArrayAudioTrack(np.zeros(48_000, np.int16)))
    try:
        caller.pc.addTransceiver(caller.audio, direction="sendrecv")
        await caller.pc.setLocalDescription(await caller.pc.createOffer())
        async with httpx.AsyncClient(base_url=url) as http:
            reply = await http.post("/v1/realtime/calls", content=caller.pc.localDescription.sdp,
                                    headers={"Content-Type": "application/sdp"})
        if reply.status_code == 201:
            async with httpx.AsyncClient(base_url=url) as http:
                await http.delete(reply.headers["location"])
        return reply
    finally:
        await caller.pc.close()


async def block_the_loop(seconds: float, each_s: float = 0.3) -> None:
    """Real load on this event loop (which runs the server): it is held for `each_s` at a time,
    as a CPU-bound callback or a starved process would hold it."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(each_s)
        await asyncio.sleep(0.01)


async def connect_live(served: Served) -> RtcCaller:
    """A live call, connected once the admission window holds no load from before: a cold
    start (first imports, a busy machine) or an earlier test's late frames (one record per
    process)."""
    admission = served.app.state.admission
    await wait_until(lambda: admission.busy() is None, 3 * WINDOW_S + 10,
                     "earlier load to leave the admission window")
    live = RtcCaller(served.url, ArrayAudioTrack(np.zeros(48_000, np.int16)))
    await live.connect()
    await live.wait_for("session.created", timeout=30)
    return live


async def test_a_late_loop_refuses_new_calls_and_carries_the_live_one(tmp_path: Path) -> None:
    settings = admitting(tmp_path, admission_max_loop_lag_ms=LAG_LIMIT_MS,
                         admission_max_cpu_wait=0)
    async with tone_server(settings) as served:
        admission = served.app.state.admission
        live = await connect_live(served)

        await block_the_loop(1.0)
        reason = admission.busy()
        assert reason is not None and "event loop" in reason
        refused = await offer(served.url)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "server_busy"
        assert int(refused.headers["retry-after"]) >= 1
        async with httpx.AsyncClient(base_url=served.url) as http:
            ready = await http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "full"
        assert served.app.state.calls.get(live.location.rsplit("/", 1)[1]) is not None

        # The live call still answers: a client event it cannot take gets its `error` event.
        live.send({"type": "no.such.event", "event_id": "evt_probe"})
        error = await live.wait_for("error", timeout=30)
        assert error["error"]["event_id"] == "evt_probe"

        # Once the window holds no late wake-up, calls are taken again.
        await wait_until(lambda: admission.busy() is None, 3 * WINDOW_S + 10,
                         "the load to leave the admission window")
        taken = await offer(served.url)
        assert taken.status_code == 201, taken.text
        metrics = served.app.state.metrics
        assert metrics.calls_refused.labels("server_busy")._value.get() == 1
        await live.close()


async def test_admission_off_takes_calls_under_the_same_load(tmp_path: Path) -> None:
    settings = admitting(tmp_path, admission_max_loop_lag_ms=0, admission_max_cpu_wait=0)
    async with tone_server(settings) as served:
        await block_the_loop(1.0)
        assert served.app.state.admission.busy() is None
        assert (await offer(served.url)).status_code == 201


async def test_late_pacing_refuses_new_calls(tmp_path: Path) -> None:
    """The live call's own pacer, on a loop held for 0.3 s at a time, sends its frames late:
    the pacing check refuses (the loop-lag and CPU checks are off), and takes calls again once
    the frames are on time."""
    settings = admitting(tmp_path, admission_max_loop_lag_ms=0, admission_max_cpu_wait=0,
                         admission_max_pacing_late_ms=50)
    async with tone_server(settings) as served:
        admission = served.app.state.admission
        live = await connect_live(served)
        await wait_until(lambda: sum(pacing_lateness.recent(WINDOW_S)) >= 50, 30,
                         "the live call's pacer to send frames")
        await wait_until(lambda: admission.busy() is None, 3 * WINDOW_S + 10,
                         "the call's start to leave the admission window")

        await block_the_loop(1.0)
        reason = admission.busy()
        assert reason is not None and "audio frames" in reason, reason
        assert admission.pacing_late() > 0.05
        refused = await offer(served.url)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "server_busy"
        async with httpx.AsyncClient(base_url=served.url) as http:
            metrics = (await http.get("/metrics")).text
        assert 'omnivox_pacing_lateness_seconds_bucket{le="+Inf"}' in metrics

        # An offer's own work (ICE, DTLS) runs on this loop too and may delay the live call's
        # frames: a few tries, each once the window is clear again.
        for _ in range(5):
            await wait_until(lambda: admission.busy() is None, 3 * WINDOW_S + 10,
                             "the late frames to leave the admission window")
            taken = await offer(served.url)
            if taken.status_code == 201:
                break
        assert taken.status_code == 201, taken.text
        await live.close()


async def test_calls_taken_together_wait_for_the_figures(tmp_path: Path) -> None:
    """Offers arriving together would all be judged on the figures of before they ran: past
    `admission_max_starting` calls taken within the window, the next is refused (every load
    check is off here) until the window has moved past them."""
    settings = admitting(tmp_path, admission_max_loop_lag_ms=0, admission_max_cpu_wait=0,
                         admission_max_starting=2)
    async with tone_server(settings) as served:
        first = [await offer(served.url) for _ in range(2)]
        assert [r.status_code for r in first] == [201, 201], [r.text for r in first]
        refused = await offer(served.url)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "server_busy"
        assert "not in the load figures yet" in refused.json()["error"]["message"]
        assert int(refused.headers["retry-after"]) >= 1
        admission = served.app.state.admission
        await wait_until(lambda: admission.busy() is None, 3 * WINDOW_S + 10,
                         "the first calls to leave the admission window")
        assert (await offer(served.url)).status_code == 201


def test_the_loop_threads_cpu_wait_is_read_from_the_scheduler() -> None:
    """The CPU check reads /proc/<pid>/schedstat; on this kernel it must be there."""
    assert schedstat.sample(os.getpid()) is not None
    assert schedstat.sample(2**22 + 12345) is None  # no such process: skipped, no error


async def test_a_call_plane_starved_of_cpu_refuses_new_calls(tmp_path: Path) -> None:
    """The loop's thread shares one core with two CPU hogs while it has work: it waits for the
    CPU most of the time, and admission control says so (the lag check is off here)."""
    settings = admitting(tmp_path, admission_max_loop_lag_ms=0, admission_max_cpu_wait=0.25)
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             preexec_fn=lambda: os.sched_setaffinity(0, {core}))
            for _ in range(2)]
    try:
        async with tone_server(settings) as served:
            admission = served.app.state.admission
            os.sched_setaffinity(0, {core})
            try:
                end = time.monotonic() + WINDOW_S + 1.0
                while time.monotonic() < end:  # work in small slices: runnable, not blocked
                    sum(range(20_000))
                    await asyncio.sleep(0)
            finally:
                os.sched_setaffinity(0, before)
            reason = admission.busy()
            assert reason is not None and "waited for a CPU" in reason, admission.cpu_wait()
            refused = await offer(served.url)
            assert refused.json()["error"]["code"] == "server_busy"
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
