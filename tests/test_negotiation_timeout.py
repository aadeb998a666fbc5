"""504 `negotiation_timeout`: an offer whose answer cannot be built within
`NEGOTIATION_TIMEOUT_S` is refused, counted (`omnivox_calls_refused_total{reason=
"negotiation_timeout"}`) and leaves no call behind: no live call, no record, no ICE socket.

The slow negotiation is real: the server is configured with a STUN server that never answers
(a bound UDP socket on loopback that reads and keeps quiet), so gathering its ICE candidates for
the answer waits for the STUN queries to time out (aioice gives them 5 s). The refusal's time
limit is made short (1 s) so the test is quick; the rest is the product as it runs.
"""

from __future__ import annotations

import asyncio
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

import agent.calls.signalling
from agent.config import Settings
from tests.media_servers import tone_server
from tests.metrics_samples import refused, scrape
from tests.rtc_client import dead_peer_offer

TIMEOUT_S = 1.0  # the product's: 10 s


@pytest.fixture
def silent_stun() -> Iterator[socket.socket]:
    """A UDP socket on loopback that takes STUN requests and never answers them."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    yield sock
    sock.close()


def drain(sock: socket.socket) -> int:
    """Datagrams waiting on `sock` (read and dropped)."""
    n = 0
    while True:
        try:
            sock.recv(65536)
        except BlockingIOError:
            return n
        n += 1






def udp_sockets() -> int:
    return len(psutil.Process().net_connections(kind="udp"))


async def test_an_answer_not_built_in_time_is_refused_504_and_leaves_nothing(
    tmp_path: Path, silent_stun: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent.calls.signalling, "NEGOTIATION_TIMEOUT_S", TIMEOUT_S)
    stun = f"stun:127.0.0.1:{silent_stun.getsockname()[1]}"
    async with tone_server(Settings(data_dir=tmp_path, ice_servers=[stun])) as served:
        sockets_before = udp_sockets()
        async with httpx.AsyncClient(base_url=served.url, timeout=30) as http:
            before = refused(await scrape(served.url), "negotiation_timeout")
            reply = await http.post("/v1/realtime/calls", content=await dead_peer_offer(),
                                    headers={"Content-Type": "application/sdp"})
            after = await scrape(served.url)
        assert reply.status_code == 504, reply.text
        assert reply.headers["content-type"].startswith("application/json")
        assert reply.json()["error"]["code"] == "negotiation_timeout", reply.json()
        assert "location" not in reply.headers
        assert drain(silent_stun) > 0, "the server never asked the STUN server: not a real wait"
        assert refused(after, "negotiation_timeout") - before == 1
        assert refused(after, "not_ready") == refused(after, "too_many_calls") == 0
        assert len(served.app.state.calls) == 0
        assert served.app.state.metrics.calls_started._value.get() == 0
        # No record of a call that was never answered.
        records = served.app.state.records
        rows = await asyncio.to_thread(_count_calls, records.path)
        assert rows == 0
        # The refused call's peer connection is closed: its ICE sockets are gone, and the STUN
        # server hears no more of it (aioice retransmits every 0.5-1.6 s while gathering).
        assert udp_sockets() <= sockets_before
        drain(silent_stun)
        await asyncio.sleep(2.0)
        assert drain(silent_stun) == 0, "the refused call is still gathering candidates"


def _count_calls(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT COUNT(*) FROM calls").fetchone()[0]


async def test_the_same_server_answers_in_time_without_the_stalled_stun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: with the same short limit and no STUN server, an answer is built in time
    (so the 504 above is the STUN wait, not the limit being too short for any offer)."""
    monkeypatch.setattr(agent.calls.signalling, "NEGOTIATION_TIMEOUT_S", TIMEOUT_S)
    sdp = await dead_peer_offer()
    async with (tone_server(Settings(data_dir=tmp_path)) as served,
                httpx.AsyncClient(base_url=served.url, timeout=30) as http):
        reply = await http.post("/v1/realtime/calls", content=sdp,
                                headers={"Content-Type": "application/sdp"})
        assert reply.status_code == 201, reply.text
        await http.delete(reply.headers["location"])
