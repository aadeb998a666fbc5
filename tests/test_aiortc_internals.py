"""The aiortc privates media/aiortc_internals.py reaches, checked on two real, connected aiortc
peers; an aiortc upgrade that moves one fails here with AiortcInternalsError naming it (its
module docstring says why each is used and what upstream could offer instead)."""

from __future__ import annotations

import asyncio
import queue
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import aiortc
import av
import numpy as np
import pytest
from aiortc import (
    AudioStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCRtpCodecParameters,
    RTCRtpTransceiver,
    RTCSessionDescription,
)
from aiortc.codecs.opus import OpusEncoder
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcrtpreceiver import RemoteStreamTrack
from aiortc.rtcsctptransport import WEBRTC_STRING
from aiortc.rtp import RtpPacket

from media.aiortc_internals import (
    TELEPHONE_EVENTS,
    AiortcInternalsError,
    LoopDecoder,
    _coroutine_method,
    _method,
    _private,
    accept_telephone_events,
    data_channel_backlog,
    divert_rtp_packets,
    jitter_buffer,
    loop_decoder,
    negotiated_codecs,
    remote_track_queue,
    send_rtp,
    stun_server,
    watch_rtp_packets,
)
from media.inbound import InboundAudio
from media.outbound import OutboundAudioTrack
from media.peer import (
    JITTER_CAPACITY,
    apply_offer,
    create_answer,
    dtmf_sender,
    guard_data_channel_receive,
    hold_inbound_audio,
    new_peer_connection,
    sent_codec,
    telephone_event_types,
)
from tests.product_calls import wait_until


@dataclass
class Pair:
    """A caller sending audio and holding a data channel, and the server's side of the call,
    set up as media/peer.py sets up a real call."""

    caller: RTCPeerConnection
    channel: RTCDataChannel
    server: RTCPeerConnection
    received: list[str | bytes] = field(default_factory=list)
    packets: list[RtpPacket] = field(default_factory=list)  # what reached aiortc's receiver
    diverted: list[RtpPacket] = field(default_factory=list)  # telephone-event, taken first

    @property
    def audio(self) -> RTCRtpTransceiver:
        return next(t for t in self.server.getTransceivers() if t.kind == "audio")


async def connect_pair() -> Pair:
    accept_telephone_events()  # the caller offers DTMF too
    caller = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    caller.addTrack(AudioStreamTrack())  # aiortc's silence, paced in real time
    pair = Pair(caller, caller.createDataChannel("oai-events"), new_peer_connection([]))
    pair.server.on("datachannel", lambda ch: ch.on("message", pair.received.append))
    await caller.setLocalDescription(await caller.createOffer())
    await apply_offer(pair.server, caller.localDescription.sdp)
    hold_inbound_audio(pair.server, 2)
    watch_rtp_packets(pair.audio.receiver, pair.packets.append)
    dtmf_types = set(telephone_event_types(pair.audio))
    divert_rtp_packets(pair.audio.receiver, dtmf_types, pair.diverted.append)
    answer = await create_answer(pair.server)
    await caller.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    await wait_until(lambda: pair.channel.readyState == "open", 20, "the data channel")
    return pair


@pytest.fixture(scope="module")
async def pair() -> AsyncIterator[Pair]:
    pair = await connect_pair()
    yield pair
    await pair.caller.close()
    await pair.server.close()


async def test_negotiated_codecs_are_what_the_sender_sends(pair: Pair) -> None:
    codecs = negotiated_codecs(pair.audio)
    assert codecs and all(isinstance(c, RTCRtpCodecParameters) for c in codecs)
    assert codecs[0].mimeType == "audio/opus"
    assert sent_codec(pair.server, pair.audio.sender) is codecs[0]


async def test_the_receiver_holds_the_jitter_buffer_it_was_given(pair: Pair) -> None:
    buffer = jitter_buffer(pair.audio.receiver)
    assert isinstance(buffer, JitterBuffer) and buffer.capacity == JITTER_CAPACITY
    hold_inbound_audio(pair.server, 3)
    assert jitter_buffer(pair.audio.receiver) is not buffer


async def test_every_rtp_packet_is_seen_and_the_remote_track_queues_its_frames(
    pair: Pair,
) -> None:
    track = pair.audio.receiver.track
    assert isinstance(track, RemoteStreamTrack)
    queue = remote_track_queue(track)
    assert isinstance(queue, asyncio.Queue)
    await wait_until(lambda: len(pair.packets) >= 10, 20, "ten RTP packets")
    assert all(isinstance(p, RtpPacket) for p in pair.packets)
    await wait_until(lambda: queue.qsize() > 0, 20, "a decoded frame, unread")
    assert remote_track_queue(OutboundAudioTrack()) is None  # not aiortc's: nothing to bound


async def test_packets_are_decoded_in_the_loop_and_the_end_still_ends_the_track(
    pair: Pair,
) -> None:
    """The frames the track queues come from the loop's decoder, not aiortc's thread; the end
    of the stream still reaches aiortc's thread, which ends the track (and lets close() join
    it: a lost end would hang the close)."""
    decoder = loop_decoder(pair.audio.receiver)
    assert decoder is not None
    track = pair.audio.receiver.track
    assert remote_track_queue(track) is not None
    before = decoder.decoded
    await wait_until(lambda: decoder.decoded >= before + 5, 20, "five frames decoded")
    frame = await track.recv()
    assert isinstance(frame, av.AudioFrame) and frame.sample_rate == 48_000

    other = await connect_pair()  # a call of its own, to end
    other_decoder = loop_decoder(other.audio.receiver)
    assert other_decoder is not None
    await wait_until(lambda: other_decoder.decoded > 0, 20, "the other call's first frame")
    ended = asyncio.ensure_future(drain(other.audio.receiver.track))
    await asyncio.wait_for(other.server.close(), 10)
    assert await asyncio.wait_for(ended, 10) > 0
    await other.caller.close()


async def test_the_loop_decoder_skips_what_it_cannot_decode_and_goes_on(pair: Pair) -> None:
    """An empty payload (padding only) would put PyAV's decoder into its end of stream, deaf
    to every later frame, and an exception raised here would end the call's DTLS transport:
    both are skipped, and the next packet decodes."""
    codec = negotiated_codecs(pair.audio)[0]
    spoken = opus_payload()
    frames = asyncio.Queue[av.AudioFrame]()
    fresh = LoopDecoder(queue.Queue(), frames, "audio")
    fresh.put((codec, JitterFrame(data=spoken, timestamp=0)))
    fresh.put((codec, JitterFrame(data=b"", timestamp=960)))
    fresh.put((codec, JitterFrame(data=b"\x03", timestamp=1920)))  # not Opus: raises
    fresh.put((codec, JitterFrame(data=spoken, timestamp=2880)))
    assert (fresh.decoded, fresh.empty, fresh.failed, frames.qsize()) == (2, 1, 1, 2)


def opus_payload() -> bytes:
    """One 20 ms Opus packet of noise, from aiortc's own encoder."""
    frame = av.AudioFrame.from_ndarray(
        np.random.default_rng(7).integers(-3000, 3000, (1, 960), dtype=np.int16),
        format="s16", layout="mono")
    frame.sample_rate, frame.pts = 48_000, 0
    payloads, _ = OpusEncoder().encode(frame)
    return payloads[0]


async def drain(track: MediaStreamTrack) -> int:
    """Read `track` until it ends; the frames read."""
    frames = 0
    try:
        while True:
            await track.recv()
            frames += 1
    except MediaStreamError:
        return frames


async def test_telephone_events_are_negotiated_sent_raw_and_taken_before_the_decoder(
    pair: Pair,
) -> None:
    assert telephone_event_types(pair.audio) == {c.payloadType: c.clockRate
                                                  for c in TELEPHONE_EVENTS}
    assert "telephone-event/8000" in pair.server.localDescription.sdp
    sender = dtmf_sender(pair.caller, 8000)
    assert sender is not None
    sender.press("5", 60)  # updates at 20 and 40 ms, then the final three times
    await asyncio.wait_for(sender.drained(), 10)
    await wait_until(lambda: len(pair.diverted) == 5, 20, "the press's five packets")
    assert {p.payload_type for p in pair.diverted} == {sender.payload_type}
    assert len({p.sequence_number for p in pair.diverted}) == 5  # each through SRTP, once
    assert sender.payload_type not in {p.payload_type for p in pair.packets}  # never decoded
    await sender.close()


async def test_an_offer_listing_telephone_event_first_is_answered_sending_audio() -> None:
    accept_telephone_events()
    caller = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    caller.addTransceiver("audio")
    await caller.setLocalDescription(await caller.createOffer())
    lines = caller.localDescription.sdp.splitlines()
    events = [line for line in lines if "telephone-event" in line]
    rest = [line for line in lines if line not in events]
    first_codec = next(i for i, line in enumerate(rest) if line.startswith("a=rtpmap:"))
    offer = "\r\n".join(rest[:first_codec] + events + rest[first_codec:]) + "\r\n"
    server = new_peer_connection([])
    await apply_offer(server, offer)
    codecs = negotiated_codecs(server.getTransceivers()[0])
    assert [c.name for c in codecs][-2:] == ["telephone-event"] * 2, codecs
    assert sent_codec(server, server.getTransceivers()[0].sender) is codecs[0]
    assert codecs[0].mimeType == "audio/opus"
    await caller.close()
    await server.close()


async def send_unchecked(channel: RTCDataChannel, pp_id: int, data: bytes) -> None:
    """Send `data` on `channel` labelled with SCTP payload protocol `pp_id` as it is, through
    the adapter's checked reach into aiortc (a text message that is not UTF-8, which send()
    cannot make)."""
    sctp = channel.transport
    why = "a raw message queued as RTCSctpTransport._data_channel_send queues one"
    queue = _private(sctp, "RTCSctpTransport", "_data_channel_queue", deque, why)
    flush = _coroutine_method(sctp, "RTCSctpTransport", "_data_channel_flush", why)
    # Counted in as send() counts it: the flush counts it out again.
    _method(channel, "RTCDataChannel", "_addBufferedAmount", why)(len(data))
    queue.append((channel, pp_id, data))
    await flush()


async def test_text_that_is_not_utf8_arrives_as_bytes_and_the_call_goes_on(pair: Pair) -> None:
    await send_unchecked(pair.channel, WEBRTC_STRING, b"\xff\xfe not utf-8")
    pair.channel.send("after it")
    await wait_until(lambda: "after it" in pair.received, 20, "the message after it")
    assert b"\xff\xfe not utf-8" in pair.received
    assert pair.server.connectionState == "connected"
    # Counted in and out like any message sent.
    await wait_until(lambda: pair.channel.bufferedAmount == 0, 20, "bufferedAmount back to 0")


async def test_backlog_lasts_until_the_peer_has_everything(pair: Pair) -> None:
    await wait_until(lambda: not data_channel_backlog(pair.channel), 30, "earlier messages")
    pair.channel.send(b"x" * 200_000)
    assert data_channel_backlog(pair.channel)
    await wait_until(lambda: not data_channel_backlog(pair.channel), 30, "the backlog to clear")
    assert len(pair.received[-1]) == 200_000


@pytest.mark.parametrize(("servers", "expected"), [
    ([], None), (["stun:stun.example.org:3478"], ("stun.example.org", 3478)),
])
async def test_the_gatherer_queries_only_the_configured_stun_server(
    servers: list[str], expected: tuple[str, int] | None
) -> None:
    pc = new_peer_connection(servers)
    gatherer = pc.addTransceiver("audio").sender.transport.transport.iceGatherer
    assert stun_server(gatherer) == expected
    await pc.close()


# -- a private that moved is an error naming it ---------------------------------------------


def _fresh() -> tuple[RTCPeerConnection, RTCRtpTransceiver]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    return pc, pc.addTransceiver("audio")


def _without_codecs() -> None:
    _, transceiver = _fresh()
    del transceiver._codecs
    negotiated_codecs(transceiver)


def _codecs_of_another_type() -> None:
    _, transceiver = _fresh()
    transceiver._codecs = ()  # type: ignore[assignment]
    negotiated_codecs(transceiver)


def _without_jitter_buffer() -> None:
    pc, transceiver = _fresh()
    del transceiver.receiver._RTCRtpReceiver__jitter_buffer  # type: ignore[attr-defined]
    hold_inbound_audio(pc, 1)


def _without_decoder_queue() -> None:
    pc, transceiver = _fresh()
    del transceiver.receiver._RTCRtpReceiver__decoder_queue  # type: ignore[attr-defined]
    hold_inbound_audio(pc, 1)


def _without_sent_queue() -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    channel = pc.createDataChannel("oai-events")
    del channel.transport._sent_queue
    data_channel_backlog(channel)


def _receive_not_a_coroutine() -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    sctp = pc.createDataChannel("oai-events").transport
    sctp._data_channel_receive = lambda *args: None  # type: ignore[method-assign]
    guard_data_channel_receive(sctp)


def _without_receive() -> None:
    guard_data_channel_receive(object())  # type: ignore[arg-type]


def _gatherer_without_connection() -> None:
    _, transceiver = _fresh()
    gatherer = transceiver.sender.transport.transport.iceGatherer
    del gatherer._connection
    stun_server(gatherer)


def _track_without_queue() -> None:
    track = RemoteStreamTrack(kind="audio")
    del track._queue
    InboundAudio(track, lambda frame: None)


def _without_codec_table() -> None:
    table = aiortc.codecs.CODECS
    try:
        aiortc.codecs.CODECS = {}  # type: ignore[attr-defined]
        accept_telephone_events()
    finally:
        aiortc.codecs.CODECS = table  # type: ignore[attr-defined]


def _without_send_rtp() -> None:
    sender = SimpleNamespace(transport=object())  # a sender whose transport lacks it
    asyncio.run(send_rtp(sender, RtpPacket()))  # type: ignore[arg-type]


def _divert_without_handler() -> None:
    divert_rtp_packets(object(), {126}, print)  # type: ignore[arg-type]


@pytest.mark.parametrize(("breaks", "named"), [
    (_without_codecs, "has no RTCRtpTransceiver._codecs"),
    (_codecs_of_another_type, "RTCRtpTransceiver._codecs is a tuple, not a list"),
    (_without_jitter_buffer, "has no RTCRtpReceiver.__jitter_buffer"),
    (_without_decoder_queue, "has no RTCRtpReceiver.__decoder_queue"),
    (_without_sent_queue, "has no RTCSctpTransport._sent_queue"),
    (_receive_not_a_coroutine, "RTCSctpTransport._data_channel_receive is not a coroutine"),
    (_without_receive, "has no RTCSctpTransport._data_channel_receive"),
    (_track_without_queue, "has no RemoteStreamTrack._queue"),
    (_gatherer_without_connection, "has no RTCIceGatherer._connection"),
    (_without_codec_table, "has no aiortc.codecs.CODECS['audio']"),
    (_without_send_rtp, "has no RTCDtlsTransport._send_rtp"),
    (_divert_without_handler, "has no RTCRtpReceiver._handle_rtp_packet"),
])
def test_a_moved_private_is_named_with_the_aiortc_version(
    breaks: Callable[[], None], named: str
) -> None:
    with pytest.raises(AiortcInternalsError) as raised:
        breaks()
    assert named in str(raised.value)
    assert f"aiortc {aiortc.__version__}" in str(raised.value)
