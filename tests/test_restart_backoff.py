"""Stage restarts (real fake-family worker processes): the supervisor's back-off starts at
`restart.backoff_s` and doubles up to `restart.backoff_max_s`; while a stage worker restarts,
`/readyz` answers 503 naming the stage (`restarting`, why, `restarts`) and a new offer gets 503
`not_ready` with `Retry-After`, counted; once it is back, offers are answered again.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import AsyncIterator

import httpx
import pytest

from agent.app import create_app
from agent.config import Settings
from pipeline.runtime.supervisor import StageState
from pipeline.turns.orchestrator import Pipeline
from tests.metrics_samples import refused, scrape
from tests.product_calls import wait_until
from tests.rtc_client import dead_peer_offer
from tests.served import Served, serve

FAMILY = "tests.fake_family"
WAIT_S = 120.0  # only keeps a broken test from hanging: fake workers start in about a second


def restart_records(caplog: pytest.LogCaptureFixture, stage: str) -> list[tuple[float, float]]:
    """(time logged, back-off) of each `restart N in X s` the supervisor logged for `stage`."""
    pattern = re.compile(rf"stage {stage}: restart \d+ in ([\d.]+) s")
    return [(r.created, float(m.group(1))) for r in caplog.records
            if r.name == "pipeline.runtime.supervisor" and (m := pattern.search(r.getMessage()))]


async def test_back_off_doubles_up_to_its_maximum(caplog: pytest.LogCaptureFixture) -> None:
    """A Talker that fails every start (a missing model, say): with backoff_s 0.1, a maximum of
    0.4 and 6 attempts, the supervisor waits 0.1, 0.2, 0.4, 0.4, 0.4 s before the restarts, then
    gives the stage up. Each wait is the one it logged: the next start (a new worker process)
    comes no sooner than that after the log record."""
    caplog.set_level(logging.INFO, logger="pipeline.runtime.supervisor")
    attempts, first, cap = 6, 0.1, 0.4
    settings = {
        "family": FAMILY,
        "stages": {"talker": {"fail_start": "no model here"}},
        "pool": {"block_count": 16, "block_size": 1 << 16},
        "restart": {"max_attempts": attempts, "backoff_s": first, "backoff_max_s": cap,
                    "heartbeat_s": 0.1, "heartbeat_timeout_s": 10.0},
    }
    async with Pipeline(settings) as pipe:
        status = pipe.health().stages["talker"]
        assert status.state == StageState.FAILED, status
        assert f"({attempts} failed starts in a row)" in status.reason, status
        assert "no model here" in status.reason
        assert status.restarts == attempts - 1, status
        assert pipe.health().stages["thinker"].state == StageState.READY
    records = restart_records(caplog, "talker")
    assert [b for _, b in records] == [0.1, 0.2, 0.4, 0.4, 0.4], records
    # Each failed start's error precedes its restart record, and the next start's failure
    # comes at least the back-off later (relative order and spacing, from the log itself).
    failures = [r.created for r in caplog.records if r.name == "pipeline.runtime.supervisor"
                and re.search(r"stage talker: failed to start", r.getMessage())]
    assert len(failures) == attempts, failures
    for (logged, backoff), next_failure in zip(records, failures[1:], strict=True):
        assert next_failure - logged >= backoff, (logged, backoff, next_failure)


# -- not_ready while a worker restarts, through the server ------------------------------------


@pytest.fixture(scope="module")
async def fake_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """The product on the fake family; its VoiceBox takes 3 s to start, so a restart of it
    leaves the server not ready for a while."""
    pipeline = Pipeline({
        "family": FAMILY,
        "stages": {"voicebox": {"start_delay_s": 3.0}},
        "pool": {"block_count": 16, "block_size": 1 << 16},
        "restart": {"max_attempts": 3, "backoff_s": 0.5, "heartbeat_s": 0.1,
                    "heartbeat_timeout_s": 10.0, "start_timeout_s": 60.0},
    })
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("data")), pipeline=pipeline)
    async with serve(app) as served:
        await wait_until(lambda: app.state.readiness.ready(), WAIT_S, "the fake stages")
        yield served






async def test_a_new_offer_gets_not_ready_while_a_worker_restarts(fake_server: Served) -> None:
    pipeline: Pipeline = fake_server.app.state.pipeline
    sdp = await dead_peer_offer()
    headers = {"Content-Type": "application/sdp"}
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=30) as http:
        before = refused(await scrape(fake_server.url), "not_ready")
        old = pipeline.health().stages["voicebox"].pid
        os.kill(old, signal.SIGKILL)
        await wait_until(lambda: pipeline.health().stages["voicebox"].state
                         == StageState.RESTARTING, WAIT_S, "the supervisor to see the loss")

        readyz = await http.get("/readyz")
        reply = await http.post("/v1/realtime/calls", content=sdp, headers=headers)
        still_restarting = pipeline.health().stages["voicebox"].state != StageState.READY
        assert still_restarting, "the worker came back before the offer: the test proves nothing"
        assert readyz.status_code == 503, readyz.text
        body = readyz.json()
        assert body["status"] == "not_ready", body
        assert body["stages"]["voicebox"]["state"] == "restarting", body
        assert body["stages"]["voicebox"]["restarts"] == 1, body
        assert body["stages"]["voicebox"]["reason"], body  # why: the worker's exit
        assert body["stages"]["thinker"]["state"] == "ready", body
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["code"] == "not_ready", reply.json()
        assert "voicebox" in reply.json()["error"]["message"]
        assert int(reply.headers["retry-after"]) > 0
        assert len(fake_server.app.state.calls) == 0
        assert refused(await scrape(fake_server.url), "not_ready") - before == 1

        await wait_until(lambda: pipeline.health().stages["voicebox"].state == StageState.READY
                         and pipeline.health().stages["voicebox"].pid != old, WAIT_S,
                         "the VoiceBox back")
        answered = await http.post("/v1/realtime/calls", content=sdp, headers=headers)
        assert answered.status_code == 201, answered.text
        assert (await http.delete(answered.headers["location"])).status_code == 204
        assert (await http.get("/readyz")).status_code == 200
