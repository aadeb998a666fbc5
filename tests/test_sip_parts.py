"""The SIP bridge's parts that need no server: its settings, the phone's paced track, and the
answers to re-INVITEs (real aiortp RTP sessions on loopback)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiortp import PortAllocator
from aiosipua import IncomingCall, SdpNegotiationError, SipDigestAuth, SipRequest, parse_sdp
from aiosipua.auth import build_credentials
from aiosipua.headers import parse_auth, stringify_auth
from aiosipua.transport import SipTransport, TcpSipTransport, UdpSipTransport

from agent.sip import aiosipua_internals
from agent.sip.digest import NONCE_TTL_S, DigestGuard
from agent.sip.phone_leg import PhoneLeg, PhoneOfferError
from agent.sip.phone_track import FRAME_BYTES, FRAME_SAMPLES, QUEUED_FRAMES, PhoneAudioTrack
from agent.sip.reinvite import renegotiate
from agent.sip.settings import (
    BridgeSettings,
    BridgeSettingsError,
    auth_user,
    listen_address,
    port_range,
    read_auth_file,
)
from tests.sip_phone import free_port


def offer(formats: str = "0 8 101", direction: str = "sendrecv", ip: str = "127.0.0.1") -> str:
    return (f"v=0\r\no=phone 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 {ip}\r\nt=0 0\r\n"
            f"m=audio {free_port()} RTP/AVP {formats}\r\na=rtpmap:0 PCMU/8000\r\n"
            "a=rtpmap:8 PCMA/8000\r\na=rtpmap:18 G729/8000\r\n"
            f"a=rtpmap:101 telephone-event/8000\r\na={direction}\r\n")


def test_listen_address_and_ports() -> None:
    assert listen_address("127.0.0.1:5060") == ("127.0.0.1", 5060)
    assert listen_address("[::1]:5070") == ("::1", 5070)
    for bad in ("5060", "localhost:5060", "127.0.0.1:0", "127.0.0.1:x"):
        with pytest.raises(BridgeSettingsError, match="--listen"):
            listen_address(bad)
    assert port_range("20000-20100") == (20000, 20100)
    with pytest.raises(BridgeSettingsError, match="--rtp-ports"):
        port_range("20000")


def test_settings_refuse_what_cannot_work() -> None:
    with pytest.raises(BridgeSettingsError, match="--media-ip"):
        BridgeSettings("0.0.0.0", 5060, "http://127.0.0.1:8000")
    with pytest.raises(BridgeSettingsError, match="--server"):
        BridgeSettings("127.0.0.1", 5060, "127.0.0.1:8000")
    with pytest.raises(BridgeSettingsError, match="--rtp-ports"):
        BridgeSettings("127.0.0.1", 5060, "http://x", rtp_ports=(30000, 20000))
    settings = BridgeSettings("127.0.0.1", 5060, "http://x", session={"type": "realtime"},
                              number_sessions={"1000": {"instructions": "support"}})
    assert settings.session_for("1000") == {"instructions": "support"}
    assert settings.session_for("2000") == {"type": "realtime"}


async def test_phone_track_cuts_paces_and_bounds() -> None:
    track = PhoneAudioTrack()
    track.push(bytes(FRAME_BYTES // 2))  # half a frame waits for the rest
    first = await track.recv()
    assert first.samples == FRAME_SAMPLES and first.sample_rate == 8000
    assert not first.to_ndarray().any()  # nothing whole had arrived: silence
    rest = b"\x10\x00" * (FRAME_SAMPLES // 2)  # completes the first frame
    track.push(rest + b"\x20\x00" * FRAME_SAMPLES * (QUEUED_FRAMES + 2))
    assert track.dropped_frames == 3  # 13 frames, 10 kept: the oldest went
    heard = await track.recv()
    assert heard.pts == FRAME_SAMPLES and (heard.to_ndarray() == 0x20).all()
    track.stop()


async def test_phone_leg_answers_g711_and_refuses_the_rest() -> None:
    ports = PortAllocator((free_port() // 2 * 2, 65_000))
    leg = await PhoneLeg.open(parse_sdp(offer("8 0 101")), "127.0.0.1", "127.0.0.1", ports)
    try:
        assert leg.codec == "PCMA"  # the phone's first choice
        audio = leg.answer.audio
        assert audio is not None and [c.encoding_name for c in audio.codecs] == [
            "PCMA", "telephone-event"]
    finally:
        await leg.close()
    with pytest.raises(PhoneOfferError, match=r"no G\.711"):
        await PhoneLeg.open(parse_sdp(offer("18")), "127.0.0.1", "127.0.0.1", ports)
    with pytest.raises(PhoneOfferError, match="no SDP offer"):
        await PhoneLeg.open(None, "127.0.0.1", "127.0.0.1", ports)


async def test_reinvite_hold_keeps_codec_and_raises_the_version() -> None:
    ports = PortAllocator((free_port() // 2 * 2, 65_000))
    leg = await PhoneLeg.open(parse_sdp(offer()), "127.0.0.1", "127.0.0.1", ports)
    try:
        hold = renegotiate(parse_sdp(offer(direction="sendonly")), leg, "127.0.0.1")
        audio = hold.audio
        assert audio is not None and audio.direction == "recvonly" and audio.port == leg.port
        assert audio.codecs[0].encoding_name == "PCMU"
        assert int(hold.origin.session_version) == int(leg.answer.origin.session_version) + 1
        with pytest.raises(SdpNegotiationError):  # the call's codec is no longer offered
            renegotiate(parse_sdp(offer("8 101")), leg, "127.0.0.1")
    finally:
        await leg.close()


def authorised_invite(guard: DigestGuard, user: str, password: str,
                      challenge: str | None = None) -> SipRequest:
    """An INVITE with the credentials aiosipua's client side computes for `guard`'s
    challenge (or another one)."""
    uri = "sip:1000@127.0.0.1"
    credentials = build_credentials(SipDigestAuth(user, password),
                                    parse_auth(challenge or guard.challenge()), "INVITE", uri)
    assert credentials is not None
    invite = SipRequest(method="INVITE", uri=uri)
    invite.set_header("Authorization", stringify_auth(credentials))
    return invite


def test_the_aiosipua_internals_the_bridge_reaches_are_there() -> None:
    aiosipua_internals.check()


@pytest.mark.parametrize(("owner", "name"), [
    (IncomingCall, "_send_response"), (SipTransport, "_dispatch"),
    (UdpSipTransport, "_udp_transport"), (TcpSipTransport, "_connections"),
])
def test_an_upgrade_that_moves_an_aiosipua_internal_is_named(
    monkeypatch: pytest.MonkeyPatch, owner: type, name: str
) -> None:
    """As an aiosipua upgrade that renamed it would leave it: gone (a method) or no longer a
    field of the transport's dataclass."""
    if name in getattr(owner, "__dataclass_fields__", {}):
        monkeypatch.delitem(owner.__dataclass_fields__, name)  # type: ignore[attr-defined]
    else:
        monkeypatch.delattr(owner, name)
    with pytest.raises(RuntimeError, match=f"{owner.__name__}.{name}"):
        aiosipua_internals.check()


def test_digest_guard_admits_the_right_password_only() -> None:
    now = [1_000_000.0]
    guard = DigestGuard({"alice": "s3cret"}, clock=lambda: now[0])
    assert 'qop="auth"' in guard.challenge() and 'realm="omnivox"' in guard.challenge()
    assert guard.admits(authorised_invite(guard, "alice", "s3cret"))
    assert not guard.admits(SipRequest(method="INVITE", uri="sip:1000@127.0.0.1"))
    assert not guard.admits(authorised_invite(guard, "alice", "wrong"))
    assert not guard.admits(authorised_invite(guard, "mallory", "s3cret"))
    other = DigestGuard({"alice": "s3cret"}, clock=lambda: now[0])  # another key: its nonces
    assert not guard.admits(authorised_invite(guard, "alice", "s3cret", other.challenge()))
    stale = authorised_invite(guard, "alice", "s3cret")
    now[0] += NONCE_TTL_S + 1
    assert not guard.admits(stale)


def test_auth_users_from_flags_and_a_file(tmp_path: Path) -> None:
    assert auth_user("alice:pa:ss") == ("alice", "pa:ss")
    with pytest.raises(BridgeSettingsError, match="USER:PASSWORD"):
        auth_user("alice")
    users = tmp_path / "users"
    users.write_text("# phones\nalice:one\n\nbob:two\n")
    assert read_auth_file(users) == {"alice": "one", "bob": "two"}
    users.write_text("alice:one\nbob\n")
    with pytest.raises(BridgeSettingsError, match="line 2"):
        read_auth_file(users)
