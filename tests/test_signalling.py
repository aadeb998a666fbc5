"""Signalling: health endpoints, the offer/answer exchange, hang-up, and every bad-input case."""

from __future__ import annotations

import gc

import httpx
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from media.aiortc_internals import stun_server
from tests.served import Served

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def make_offer(kinds: tuple[str, ...] = ("audio",), datachannel: bool = True) -> str:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    for kind in kinds:
        pc.addTransceiver(kind, direction="sendrecv")
    if datachannel:
        pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


def live_peer_connections() -> int:
    gc.collect()
    return sum(
        1
        for o in gc.get_objects()
        if isinstance(o, RTCPeerConnection) and o.connectionState != "closed"
    )


async def post_offer(url: str, body: bytes | str, content_type: str = "application/sdp"):
    async with httpx.AsyncClient(base_url=url, timeout=15) as http:
        return await http.post(
            "/v1/realtime/calls", content=body, headers={"Content-Type": content_type}
        )


async def test_healthz_and_readyz(media_server: Served) -> None:
    async with httpx.AsyncClient(base_url=media_server.url) as http:
        health = await http.get("/healthz")
        ready = await http.get("/readyz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


async def test_offer_gets_answer_location_and_hang_up(media_server: Served) -> None:
    reply = await post_offer(media_server.url, await make_offer())
    assert reply.status_code == 201, reply.text
    assert reply.headers["content-type"].startswith("application/sdp")
    assert reply.text.startswith("v=0")
    assert "a=candidate" in reply.text
    assert "opus/48000" in reply.text
    location = reply.headers["location"]
    assert location.startswith("/v1/realtime/calls/rtc_")
    call_id = location.rsplit("/", 1)[1]
    assert media_server.app.state.calls.get(call_id) is not None
    async with httpx.AsyncClient(base_url=media_server.url) as http:
        assert (await http.delete(location)).status_code == 204
        assert media_server.app.state.calls.get(call_id) is None
        gone = await http.delete(location)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "call_not_found"


async def test_no_public_stun_server_by_default(media_server: Served) -> None:
    reply = await post_offer(media_server.url, await make_offer())
    assert reply.status_code == 201
    call = media_server.app.state.calls.get(reply.headers["location"].rsplit("/", 1)[1])
    # The gatherer's STUN server is what would leak traffic.
    gatherer = call.pc.getTransceivers()[0].sender.transport.transport.iceGatherer
    assert stun_server(gatherer) is None
    assert "typ srflx" not in reply.text
    await call.close()


async def test_mdns_candidates_do_not_stall_the_answer(media_server: Served) -> None:
    offer = await make_offer()
    offer = offer.replace("a=end-of-candidates", "")
    mdns = (
        "a=candidate:1 1 udp 2122260223 1f2e3d4c-aaaa-bbbb-cccc-0123456789ab.local 54400 typ host"
    )
    offer = offer.replace("a=mid:0\r\n", f"a=mid:0\r\n{mdns}\r\n", 1)
    assert ".local" in offer
    reply = await post_offer(media_server.url, offer)
    assert reply.status_code == 201, reply.text
    assert reply.elapsed.total_seconds() < 5
    call = media_server.app.state.calls.get(reply.headers["location"].rsplit("/", 1)[1])
    await call.close()


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        ("v=0\r\nthis is not sdp\r\n", "application/sdp", 400, "invalid_sdp"),
        ("hello", "application/sdp", 400, "invalid_sdp"),
        ("", "application/sdp", 400, "invalid_sdp"),
        (b"v=0\r\n\xff\xfe", "application/sdp", 400, "invalid_sdp"),
        ("v=0\r\n" + "a=x\r\n" * 20_000, "application/sdp", 413, "sdp_too_large"),
        ("v=0\r\n", "application/json", 415, "unsupported_media_type"),
        ("v=0\r\n", "text/plain", 415, "unsupported_media_type"),
    ],
)
async def test_bad_offers_get_json_errors(
    media_server: Served, body: str | bytes, content_type: str, status: int, code: str
) -> None:
    before = live_peer_connections()
    reply = await post_offer(media_server.url, body, content_type)
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.json()["error"]["code"] == code
    assert len(media_server.app.state.calls) == 0
    assert live_peer_connections() == before


async def test_offer_without_audio_is_refused(media_server: Served) -> None:
    before = live_peer_connections()
    reply = await post_offer(media_server.url, await make_offer(kinds=("video",)))
    assert reply.status_code == 400
    assert "no audio m-line" in reply.json()["error"]["message"]
    reply = await post_offer(media_server.url, await make_offer(kinds=()))
    assert reply.status_code == 400
    assert len(media_server.app.state.calls) == 0
    assert live_peer_connections() == before


async def test_offer_without_ice_credentials_is_refused(media_server: Served) -> None:
    offer = "\r\n".join(
        line for line in (await make_offer()).split("\r\n") if not line.startswith("a=ice-pwd")
    )
    reply = await post_offer(media_server.url, offer)
    assert reply.status_code == 400
    assert "ICE credentials" in reply.json()["error"]["message"]
    assert len(media_server.app.state.calls) == 0


async def test_server_still_answers_after_bad_input(media_server: Served) -> None:
    for body in ("garbage", "v=0\r\nm=audio\r\n", "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF x\r\n"):
        assert (await post_offer(media_server.url, body)).status_code == 400
    reply = await post_offer(media_server.url, await make_offer())
    assert reply.status_code == 201
    call = media_server.app.state.calls.get(reply.headers["location"].rsplit("/", 1)[1])
    await call.close()
