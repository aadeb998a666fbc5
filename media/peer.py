"""The server's side of one WebRTC peer connection: ICE configuration, codecs, offer -> answer."""

from __future__ import annotations

from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)

from media.sdp import AUDIO_CODECS, without_mdns_candidates


def new_peer_connection(ice_servers: list[str]) -> RTCPeerConnection:
    """A peer connection with exactly the ICE servers configured (aiortc adds a public STUN
    server when given no configuration; an empty list means host candidates only)."""
    servers = [RTCIceServer(urls=url) for url in ice_servers]
    return RTCPeerConnection(RTCConfiguration(iceServers=servers))


def prefer_audio_codecs(pc: RTCPeerConnection) -> None:
    """Opus first, then G.711 (PCMU, PCMA) for SIP bridges; nothing else for audio."""
    capabilities = RTCRtpSender.getCapabilities("audio").codecs
    ranked = sorted(
        (c for c in capabilities if c.name in AUDIO_CODECS),
        key=lambda c: AUDIO_CODECS.index(c.name),
    )
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio":
            transceiver.setCodecPreferences(ranked)


async def apply_offer(pc: RTCPeerConnection, offer_sdp: str) -> None:
    """Set the caller's offer as the remote description, minus mDNS candidates."""
    offer = RTCSessionDescription(sdp=without_mdns_candidates(offer_sdp), type="offer")
    await pc.setRemoteDescription(offer)


async def create_answer(pc: RTCPeerConnection) -> str:
    """Answer the applied offer; returns the SDP with our gathered host candidates."""
    prefer_audio_codecs(pc)
    await pc.setLocalDescription(await pc.createAnswer())
    return pc.localDescription.sdp
