"""`omnivox sip` end to end: a real SIP phone (SIPp, tests/sip_phone.py) calls the bridge,
which runs as its own process and bridges to the shared tiny server over WebRTC.

Checked: the call is answered, the server's leg is G.711 only (the bridge's offer holds no
Opus and no data channel), the phone hears the agent answer its question (RTP with sound at
the phone's RTP address), a BYE from the phone ends the server's call, and the server ending
its call (`POST /v1/realtime/calls/{id}/hangup`) sends the phone a BYE; a hold re-INVITE is
answered and the call goes on; a phone without G.711 is refused; the keys the phone presses
arrive as events on the call's sideband.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.product_calls import wait_until
from tests.served import Served
from tests.sip_phone import phone_speech, recording_rtp, running_bridge, sipp_call, sipp_result

pytestmark = pytest.mark.engines

SOAK_CALLS = int(os.environ.get("OMNIVOX_SIP_SOAK_CALLS", "0"))  # make soak: 8


@pytest.fixture(scope="module")
def phone_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("phone")
    phone_speech("what is the weather like today", folder)
    return folder


@pytest.fixture(scope="module")
async def bridge(shared_tiny_server: Served) -> AsyncIterator[str]:
    """`omnivox sip` on a loopback port, bridging to the shared tiny server: its HOST:PORT."""
    async with running_bridge(shared_tiny_server.url) as address:
        yield address


def live_calls(served: Served) -> list[str]:
    return [call.id for call in served.app.state.calls]


async def bridged_call(served: Served) -> tuple[str, str]:
    """The server's call placed by the bridge, once its offer is applied: (id, offer SDP)."""
    def offered() -> list[tuple[str, str]]:
        return [(call.id, call.pc.remoteDescription.sdp) for call in served.app.state.calls
                if call.pc.remoteDescription is not None]

    await wait_until(lambda: bool(offered()), 30, "the bridged call")
    return offered()[0]


@pytest.mark.parametrize("transport", ["u1", "t1"], ids=["udp", "tcp"])
async def test_phone_call_answered_and_bye_from_phone_ends_server_call(
    tiny_server: Served, bridge: str, phone_folder: Path, transport: str
) -> None:
    async with (recording_rtp() as (sink, heard),
                sipp_call("phone_hangs_up.xml", bridge, phone_folder, sink, "-d", "3000",
                          "-t", transport) as sipp):
        _, offer = await bridged_call(tiny_server)
        rc, out = await sipp_result(sipp, 60)
        assert rc == 0, out  # answered 200, ACKed, BYE answered 200
        await wait_until(lambda: not live_calls(tiny_server), 15, "the server's call to end")
    audio = offer[offer.index("m=audio"):]
    assert "PCMU/8000" in audio and "opus" not in audio.lower(), offer
    assert "m=application" not in offer  # no data channel: a bridge's offer
    assert heard.packets > 50 and heard.payload_types == {0}, heard  # 20 ms PCMU to the phone


async def test_phone_hears_the_agent_and_server_hangup_sends_bye(
    tiny_server: Served, bridge: str, phone_folder: Path
) -> None:
    async with (recording_rtp() as (sink, heard),
                sipp_call("server_hangs_up.xml", bridge, phone_folder, sink) as sipp):
        call_id, _ = await bridged_call(tiny_server)
        # The question takes about 3 s; the agent's answer is about 10 s of sound.
        await wait_until(lambda: heard.loud >= 25, 60, "half a second of the agent's answer")
        async with httpx.AsyncClient(base_url=tiny_server.url) as http:
            reply = await http.post(f"/v1/realtime/calls/{call_id}/hangup")
        assert reply.status_code == 204
        rc, out = await sipp_result(sipp, 30)
        assert rc == 0, out  # the phone got the BYE and answered it
    assert not live_calls(tiny_server)


async def test_phone_offering_no_g711_is_refused_488(
    tiny_server: Served, bridge: str, phone_folder: Path
) -> None:
    async with (recording_rtp() as (sink, _),
                sipp_call("no_g711.xml", bridge, phone_folder, sink) as sipp):
        rc, out = await sipp_result(sipp, 30)
    assert rc == 0, out  # 488 received (anything else fails the scenario)
    assert not live_calls(tiny_server)  # the server was never called


async def test_hold_reinvite_is_answered_and_the_call_goes_on(
    tiny_server: Served, bridge: str, phone_folder: Path
) -> None:
    async with (recording_rtp() as (sink, _),
                sipp_call("reinvite_hold.xml", bridge, phone_folder, sink, "-d", "1000") as sipp):
        await bridged_call(tiny_server)
        rc, out = await sipp_result(sipp, 60)
        await wait_until(lambda: not live_calls(tiny_server), 15, "the server's call to end")
    assert rc == 0, out  # the re-INVITE's 200 said a=recvonly; the BYE after it was answered


@pytest.mark.skipif(not SOAK_CALLS, reason="make soak (OMNIVOX_SIP_SOAK_CALLS=8)")
async def test_concurrent_phone_calls_hold(
    tiny_server: Served, bridge: str, phone_folder: Path
) -> None:
    """SOAK_CALLS phones call at once, each asks its question and listens 30 s: every call is
    bridged at the same time and every phone hears its own answer."""
    most = 0
    async with (recording_rtp() as (sink, heard),
                sipp_call("phone_hangs_up.xml", bridge, phone_folder, sink, "-d", "30000",
                          calls=SOAK_CALLS) as sipp):
        result = asyncio.ensure_future(sipp_result(sipp, 120))
        while not result.done():
            most = max(most, len(live_calls(tiny_server)))
            await asyncio.sleep(0.2)
        rc, out = await result
        await wait_until(lambda: not live_calls(tiny_server), 30, "every server call to end")
    assert rc == 0, out
    assert most == SOAK_CALLS
    answered = [n for n in heard.loud_by_source.values() if n >= 25]
    loud = sorted(heard.loud_by_source.values())
    print(f"sip soak: {SOAK_CALLS} calls held; loud packets heard per call: {loud}")
    assert len(answered) == SOAK_CALLS, heard.loud_by_source


async def test_keys_the_phone_presses_arrive_as_events_on_the_sideband(
    tiny_server: Served, bridge: str, phone_folder: Path
) -> None:
    """The phone presses 1, # and 5 (RFC 4733 on its RTP); the bridge relays each as RFC 4733
    on its WebRTC leg; the server's call sends `input_audio_buffer.dtmf_event_received` for
    each, seen here on the call's sideband WebSocket."""
    events: list[dict[str, Any]] = []
    async with (recording_rtp() as (sink, _),
                sipp_call("phone_sends_dtmf.xml", bridge, phone_folder, sink) as sipp):
        call_id, offer = await bridged_call(tiny_server)
        url = tiny_server.url.replace("http://", "ws://") + f"/v1/realtime?call_id={call_id}"
        async with asyncio.timeout(60), connect(url) as sideband:
            async for message in sideband:  # until the call ends, which closes the sideband
                events.append(json.loads(message))
        rc, out = await sipp_result(sipp, 60)
    assert rc == 0, out
    assert "telephone-event/8000" in offer[offer.index("m=audio"):], offer
    pressed = [e for e in events if e["type"] == "input_audio_buffer.dtmf_event_received"]
    assert [e["event"] for e in pressed] == ["1", "#", "5"], events
