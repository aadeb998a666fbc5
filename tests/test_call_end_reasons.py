"""Every call end reason docs/operations.md names, on real calls (media-only servers, real
aiortc peers):
each is written to the call's record (`GET /v1/calls/{id}`) and, for the calls lost for want of
a working connection, counted in `omnivox_calls_dropped_total{reason}`; the others are not.

`hangup` is covered by tests/test_records.py; here are the rest: `connect_timeout`,
`connection_failed`, `connection_closed`, `idle_timeout`, `call_duration_exceeded` and
`server_shutdown`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from prometheus_client.parser import text_string_to_metric_families

import agent.calls.call
from agent.config import Settings
from tests.media_servers import tone_server
from tests.product_calls import wait_until
from tests.rtc_client import ArrayAudioTrack, RtcCaller, dead_peer_offer
from tests.served import Served

DROPPED = "omnivox_calls_dropped_total"
END_WAIT_S = 30.0  # only keeps a broken test from hanging


def settings(data_dir: Path, **fields: Any) -> Settings:
    return Settings(data_dir=data_dir, **{"max_calls": 4, **fields})


async def scrape(url: str) -> dict[tuple[str, tuple], float]:
    async with httpx.AsyncClient(base_url=url) as http:
        text = (await http.get("/metrics")).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def dropped(samples: dict, reason: str) -> float:
    return samples.get((DROPPED, (("reason", reason),)), 0.0)


def all_dropped(samples: dict) -> float:
    return sum(v for (name, _), v in samples.items() if name == DROPPED)


async def record(url: str, call_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url) as http:
        reply = await http.get(f"/v1/calls/{call_id}")
    assert reply.status_code == 200, reply.text
    return reply.json()


async def connected(url: str) -> RtcCaller:
    caller = RtcCaller(url, ArrayAudioTrack(np.zeros(0, np.int16)))
    await caller.connect()
    await caller.wait_for("session.created", timeout=20)
    return caller


def call_id(location: str) -> str:
    return location.rsplit("/", 1)[1]




async def post_offer(url: str, sdp: str) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=15) as http:
        answered = await http.post("/v1/realtime/calls", content=sdp,
                                   headers={"Content-Type": "application/sdp"})
    assert answered.status_code == 201, answered.text
    return call_id(answered.headers["location"])


async def ended(served: Served, cid: str) -> dict[str, Any]:
    await wait_until(lambda: served.app.state.calls.get(cid) is None, END_WAIT_S,
                     f"call {cid} to end")
    return await record(served.url, cid)


async def test_a_call_that_never_connects_ends_connect_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answered offer whose peer never connects: the watchdog ends it, recorded and
    counted as `connect_timeout`."""
    monkeypatch.setattr(agent.calls.call, "CONNECT_TIMEOUT_S", 1.0)  # the watchdog: 30 s
    async with tone_server(settings(tmp_path)) as served:
        before = await scrape(served.url)
        silent = await post_offer(served.url, await dead_peer_offer())
        assert (await record(served.url, silent))["ended_at"] is None  # live until the watchdog
        assert (await ended(served, silent))["end_reason"] == "connect_timeout"
        middle = await scrape(served.url)
        assert dropped(middle, "connect_timeout") - dropped(before, "connect_timeout") == 1
        assert all_dropped(middle) - all_dropped(before) == 1

        assert middle[("omnivox_active_calls", ())] == 0


async def test_a_caller_failing_dtls_ends_connection_failed(tmp_path: Path) -> None:
    """ICE connects, but the caller's DTLS certificate is not the one its offer's fingerprint
    names: the server's DTLS handshake fails, and the call ends `connection_failed`, counted as
    dropped."""
    async with tone_server(settings(tmp_path)) as served:
        before = await scrape(served.url)
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        try:
            pc.addTransceiver("audio", direction="sendrecv")
            pc.createDataChannel("oai-events")
            await pc.setLocalDescription(await pc.createOffer())
            sdp, n = re.subn(r"a=fingerprint:sha-256 [0-9A-F:]+",
                             "a=fingerprint:sha-256 " + ":".join(["AB"] * 32),
                             pc.localDescription.sdp)
            assert n >= 1
            async with httpx.AsyncClient(base_url=served.url, timeout=15) as http:
                answered = await http.post("/v1/realtime/calls", content=sdp,
                                           headers={"Content-Type": "application/sdp"})
            assert answered.status_code == 201, answered.text
            cid = call_id(answered.headers["location"])
            await pc.setRemoteDescription(RTCSessionDescription(answered.text, "answer"))
            row = await ended(served, cid)
            assert row["end_reason"] == "connection_failed", row
            after = await scrape(served.url)
            assert dropped(after, "connection_failed") - dropped(before, "connection_failed") == 1
            assert all_dropped(after) - all_dropped(before) == 1
            assert after[("omnivox_active_calls", ())] == 0
        finally:
            await pc.close()


async def test_caller_closing_its_peer_connection_ends_the_call_connection_closed(
    tmp_path: Path,
) -> None:
    async with tone_server(settings(tmp_path)) as served:
        before = await scrape(served.url)
        caller = await connected(served.url)
        cid = call_id(caller.location)
        await caller.close()  # no DELETE: the peer connection just goes away
        row = await ended(served, cid)
        assert row["end_reason"] == "connection_closed", row
        assert row["ended_at"] >= row["started_at"]
        assert all_dropped(await scrape(served.url)) == all_dropped(before)  # not a drop


@pytest.mark.parametrize("limits, reason", [
    ({"idle_timeout_s": 1, "max_call_s": 600}, "idle_timeout"),
    ({"idle_timeout_s": 600, "max_call_s": 2}, "call_duration_exceeded"),
])
async def test_per_call_limits_end_the_call_with_their_reason(
    tmp_path: Path, limits: dict[str, int], reason: str
) -> None:
    """The caller gets an `error` event naming the limit, then the call ends with that reason in
    its record; it is not counted as dropped."""
    async with tone_server(settings(tmp_path, **limits)) as served:
        before = await scrape(served.url)
        caller = await connected(served.url)
        try:
            cid = call_id(caller.location)
            error = await caller.wait_for("error", timeout=END_WAIT_S)
            assert error["error"]["code"] == reason, error
            row = await ended(served, cid)
            assert row["end_reason"] == reason, row
            assert [e["error"]["code"] for e in caller.of_type("error")] == [reason]
            assert all_dropped(await scrape(served.url)) == all_dropped(before)
        finally:
            await caller.close()


async def test_server_stopped_with_a_live_call_records_server_shutdown(tmp_path: Path) -> None:
    """The call is still live when the server stops; a server started afterwards on the same
    data directory reports it ended with `server_shutdown`."""
    caller = None
    try:
        async with tone_server(settings(tmp_path)) as served:
            caller = await connected(served.url)
            cid = call_id(caller.location)
            assert (await record(served.url, cid))["ended_at"] is None
        async with tone_server(settings(tmp_path)) as again:
            row = await record(again.url, cid)
        assert row["end_reason"] == "server_shutdown", row
        assert row["ended_at"] >= row["started_at"]
    finally:
        if caller is not None:
            await caller.close()
