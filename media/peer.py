"""The server's side of one WebRTC peer connection: ICE configuration, codecs, offer -> answer."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpCodecParameters,
    RTCRtpSender,
    RTCRtpTransceiver,
    RTCSctpTransport,
    RTCSessionDescription,
)
from aiortc.codecs import get_decoder
from aiortc.codecs.base import Decoder
from aiortc.rtcsctptransport import WEBRTC_BINARY, WEBRTC_STRING
from aiortc.rtp import RtpPacket

from media.aiortc_internals import (
    DataChannelReceive,
    accept_telephone_events,
    decode_in_loop,
    divert_rtp_packets,
    negotiated_codecs,
    put_codecs_last,
    replace_jitter_buffer,
    send_rtp,
    wrap_data_channel_receive,
)
from media.dtmf import TELEPHONE_EVENT, DtmfDecoder, DtmfSender
from media.opus_voice import VoiceOpusDecoder
from media.sdp import AUDIO_CODECS, without_mdns_candidates

log = logging.getLogger(__name__)


def new_peer_connection(ice_servers: list[str]) -> RTCPeerConnection:
    """A peer connection with exactly the ICE servers configured (aiortc adds a public STUN
    server when given no configuration; an empty list means host candidates only)."""
    accept_telephone_events()  # DTMF (RFC 4733) offered and accepted beside the audio
    servers = [RTCIceServer(urls=url) for url in ice_servers]
    return RTCPeerConnection(RTCConfiguration(iceServers=servers))


def prefer_audio_codecs(pc: RTCPeerConnection) -> None:
    """Opus first, then G.711 (PCMU, PCMA) for SIP bridges, then DTMF; nothing else."""
    capabilities = RTCRtpSender.getCapabilities("audio").codecs
    ranked = sorted(
        (c for c in capabilities if c.name in AUDIO_CODECS),
        key=lambda c: AUDIO_CODECS.index(c.name),
    ) + [c for c in capabilities if c.name == TELEPHONE_EVENT]
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio":
            transceiver.setCodecPreferences(ranked)


async def apply_offer(pc: RTCPeerConnection, offer_sdp: str) -> None:
    """Set the caller's offer as the remote description, minus mDNS candidates."""
    offer = RTCSessionDescription(sdp=without_mdns_candidates(offer_sdp), type="offer")
    await pc.setRemoteDescription(offer)
    for transceiver in pc.getTransceivers():  # audio first, whatever order the offer lists
        put_codecs_last(transceiver, {TELEPHONE_EVENT})
    if pc.sctp is not None:
        guard_data_channel_receive(pc.sctp)


def sent_codec(pc: RTCPeerConnection, sender: RTCRtpSender) -> RTCRtpCodecParameters | None:
    """The codec `sender` sends with, once negotiated (aiortc's sender takes the first of its
    transceiver's negotiated codecs); None before negotiation."""
    for transceiver in pc.getTransceivers():
        if transceiver.sender is sender:
            codecs = negotiated_codecs(transceiver)
            return codecs[0] if codecs else None
    return None


def hold_inbound_audio(pc: RTCPeerConnection, packets: int) -> None:
    """Let each audio receiver hold `packets` packets before decoding (aiortc holds 4), and
    decode them in the event loop.

    The server never plays the caller's audio out, so a smooth playout buys nothing here: the
    buffer's one use is to put reordered packets back in order. Each packet held delays the
    VAD's end of turn, and so the reply, and the detection of a barge-in, by 20 ms; aiortc's 4
    cost 60 ms more than 1. aiortc takes no setting for it, so its receiver's buffer is
    replaced before the first packet arrives (call this before the connection is up).
    aiortc's decoder thread hands every decoded 20 ms frame back to the loop as a task of its
    own, which costs more than decoding it in the loop (media/aiortc_internals.py). Opus is
    decoded to mono: the VAD hears mono (media/opus_voice.py).
    """
    if not 1 <= packets <= JITTER_CAPACITY:
        raise ValueError(f"inbound audio packets held must be 1..{JITTER_CAPACITY}, got {packets}")
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio":
            replace_jitter_buffer(transceiver.receiver, JITTER_CAPACITY, prefetch=packets)
            decode_in_loop(transceiver.receiver, inbound_decoder)


def inbound_decoder(codec: RTCRtpCodecParameters) -> Decoder:
    """The decoder of the caller's audio: Opus to mono, others aiortc's."""
    if codec.name.lower() == "opus":
        return VoiceOpusDecoder()
    decoder: Decoder = get_decoder(codec)
    return decoder


JITTER_CAPACITY = 16  # aiortc's own for audio: 320 ms of 20 ms packets


def guard_data_channel_receive(sctp: RTCSctpTransport) -> None:
    """Keep one bad data-channel message from ending the call.

    aiortc decodes text messages as strict UTF-8 (and parses channel-open messages) inside its
    DTLS receive loop, where any exception tears down the whole transport: a single text
    message that is not UTF-8 would drop the call without a word. Such text is handed on as
    binary instead (the call's own parsing answers it with an error event), and a message that
    still makes aiortc raise is logged and dropped.
    """
    wrap_data_channel_receive(sctp, _guarded)


def _guarded(receive: DataChannelReceive) -> DataChannelReceive:
    async def guarded(stream_id: int, pp_id: int, data: bytes) -> None:
        if pp_id == WEBRTC_STRING:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                pp_id = WEBRTC_BINARY
        try:
            await receive(stream_id, pp_id, data)
        except Exception:
            log.warning("dropped a data-channel message aiortc could not take", exc_info=True)

    return guarded


async def create_answer(pc: RTCPeerConnection) -> str:
    """Answer the applied offer; returns the SDP with our gathered host candidates."""
    prefer_audio_codecs(pc)
    await pc.setLocalDescription(await pc.createAnswer())
    return pc.localDescription.sdp


def telephone_event_types(transceiver: RTCRtpTransceiver) -> dict[int, int]:
    """The negotiated telephone-event payload types of `transceiver`, with their clock rates."""
    return {c.payloadType: c.clockRate for c in negotiated_codecs(transceiver)
            if c.name == TELEPHONE_EVENT and c.payloadType is not None}


def watch_dtmf(pc: RTCPeerConnection, on_digit: Callable[[str], None]) -> None:
    """Call `on_digit` once per key the caller presses (RFC 4733 on its audio), once the offer
    is applied. The DTMF packets are taken out before aiortc's receiver: they never reach the
    audio decoder, and so never the VAD."""
    for transceiver in pc.getTransceivers():
        types = telephone_event_types(transceiver) if transceiver.kind == "audio" else {}
        if not types:
            continue
        decoder = DtmfDecoder()

        def decode(packet: RtpPacket, decoder: DtmfDecoder = decoder) -> None:
            digit = decoder.push(packet.ssrc, packet.timestamp, packet.payload)
            if digit is not None:
                on_digit(digit)

        divert_rtp_packets(transceiver.receiver, set(types), decode)


def dtmf_sender(pc: RTCPeerConnection, clock_rate: int = 8000) -> DtmfSender | None:
    """A sender of key presses on the first audio transceiver that negotiated telephone-event
    at `clock_rate` (once the answer is applied); None when none did."""
    for transceiver in pc.getTransceivers():
        types = telephone_event_types(transceiver) if transceiver.kind == "audio" else {}
        payload_type = next((pt for pt, rate in types.items() if rate == clock_rate), None)
        if payload_type is not None:
            return DtmfSender(functools.partial(send_rtp, transceiver.sender), payload_type,
                              clock_rate)
    return None
