"""The one module that reaches into aiortc's private attributes; each reach is checked and
raises `AiortcInternalsError`, naming the attribute and the aiortc version, when it is gone.

aiortc has no public way to do these things; each private is listed with why it is used and
what upstream offers or could offer instead:

- `RTCRtpTransceiver._codecs` (list of RTCRtpCodecParameters): the codecs negotiated for a
  transceiver; the sender sends with the first. Used to encode the agent's audio in the event
  loop with the same codec (media/encoded_audio.py). W3C's `RTCRtpSender.getParameters()`
  would answer this; aiortc does not implement it (the answer SDP says the same, but parsing
  it back means trusting the order aiortc writes it in). Also sorted in place so that
  telephone-event, which an offer may list first, is never the codec the sender takes.
- `RTCRtpReceiver.__jitter_buffer` (a JitterBuffer; mangled `_RTCRtpReceiver__jitter_buffer`):
  replaced to hold fewer packets before decoding than aiortc's 4 (each packet held delays the
  end of a turn and barge-in detection by 20 ms). aiortc has no setting for the receiver's
  jitter buffer capacity or prefetch; an upstream option (say on RTCRtpReceiver or
  RTCConfiguration) would be welcome and would retire this.
- `RTCRtpReceiver.__decoder_queue` (a queue.Queue; mangled `_RTCRtpReceiver__decoder_queue`):
  aiortc decodes each received packet in a thread of its own per receiver, and hands each
  decoded frame back to the event loop with `asyncio.run_coroutine_threadsafe` (a task, a
  future and a wake-up of the loop per 20 ms packet). The queue is replaced by `LoopDecoder`,
  which decodes in the event loop, at once, and queues the frames for the remote track itself;
  the end of the stream still goes to aiortc's thread, which ends the track as before. An
  upstream option to decode in the loop (or a decoded-frame callback) would retire this.
- `RTCSctpTransport._data_channel_receive` (a coroutine method): wrapped so one data-channel
  message aiortc cannot decode (text that is not UTF-8) does not tear down the whole call from
  inside aiortc's receive loop. Upstream would need to catch decode errors per message (or
  deliver undecodable text as bytes); there is no hook for it today.
- `RTCSctpTransport._data_channel_queue`, `_outbound_queue`, `_sent_queue` (deques): whether a
  data channel still holds messages not yet acknowledged by the peer, so a call can wait for
  its last event before hanging up. `RTCDataChannel.bufferedAmount` alone drops to zero once a
  message is handed to SCTP, before it is sent or acknowledged; upstream would need an
  "all acknowledged" event or count.
- `RemoteStreamTrack._queue` (an asyncio.Queue of decoded frames, None at the end): aiortc
  queues decoded remote frames without limit; reading its size bounds a caller's backlog.
  Upstream could bound the queue (a maxsize, dropping the oldest) or expose its length.
- `RTCRtpReceiver._handle_rtp_packet` (a coroutine method): wrapped to note when each RTP
  packet arrives, before the jitter buffer holds it (load measurements only). aiortc offers
  no per-packet event on a receiver. Also replaced outright for the bench's light callers,
  which judge a reply from its packets' sizes and must not pay for decoding them.
- `RTCIceGatherer._connection` (an aioice Connection): which STUN server a gatherer will
  query, so tests can check that no public one is configured unless asked for. W3C's
  `RTCPeerConnection.getConfiguration()` would answer it; aiortc does not implement it.
- `RTCSctpTransport._data_channel_queue`, `_data_channel_flush()` and
  `RTCDataChannel._addBufferedAmount()`: this adapter's test sends text messages that are not
  UTF-8, which `RTCDataChannel.send` (rightly) cannot produce, by queuing them the way it
  queues a message (through `_private` and `_coroutine_method`, so a move fails there too).
- `aiortc.codecs.CODECS["audio"]` (the codecs every peer connection negotiates from; aiortc's
  peer connection reads the same list): `telephone-event` (RFC 4733 DTMF) is added so offers
  from SIP bridges and browsers get it accepted in the answer. aiortc has no way to register
  a codec; upstream could take extra codecs in RTCConfiguration.
- `RTCRtpReceiver._handle_rtp_packet` again: telephone-event packets are taken out before
  aiortc's handler, which would hand them to its jitter buffer and then to a decoder that
  does not exist for them. Upstream would need RTCDTMFSender's receiving counterpart.
- `RTCDtlsTransport._send_rtp` (a coroutine method): sends DTMF as raw RTP (SRTP-protected
  by the transport). W3C's `RTCRtpSender.dtmf` (RTCDTMFSender) would do it; aiortc has none.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import aiortc
from aioice import Connection
from aiortc import (
    MediaStreamTrack,
    RTCDataChannel,
    RTCDtlsTransport,
    RTCIceGatherer,
    RTCRtpCodecParameters,
    RTCRtpReceiver,
    RTCRtpSender,
    RTCRtpTransceiver,
    RTCSctpTransport,
)
from aiortc import codecs as aiortc_codecs
from aiortc.codecs import get_decoder
from aiortc.codecs.base import Decoder
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.rtcrtpreceiver import RemoteStreamTrack
from aiortc.rtp import RtpPacket

AIORTC_VERSION: str = aiortc.__version__
logger = logging.getLogger(__name__)

# A decoder for a negotiated codec (aiortc's get_decoder, or one of the caller's own).
DecoderFor = Callable[[RTCRtpCodecParameters], Decoder]
# aiortc's receive of one data-channel message: (stream id, payload protocol id, data).
DataChannelReceive = Callable[[int, int, bytes], Coroutine[Any, Any, None]]

_T = TypeVar("_T")
_ABSENT = object()
_JITTER_BUFFER = "_RTCRtpReceiver__jitter_buffer"  # Python's mangling of `self.__jitter_buffer`
_DECODER_QUEUE = "_RTCRtpReceiver__decoder_queue"
# Methods replaced on one instance, by name: the instance attribute shadows the class's method.
_DATA_CHANNEL_RECEIVE = "_data_channel_receive"
_HANDLE_RTP_PACKET = "_handle_rtp_packet"


class AiortcInternalsError(RuntimeError):
    """aiortc lacks (or changed the type of) a private attribute omnivox relies on: an aiortc
    upgrade moved it, and media/aiortc_internals.py needs to follow."""


def _shown(owner: str, name: str) -> str:
    """`Owner.name` as aiortc's source spells it (`__x`, not its mangled `_Owner__x`)."""
    mangled = f"_{owner}__"
    if name.startswith(mangled):
        return f"{owner}.__{name.removeprefix(mangled)} ({name})"
    return f"{owner}.{name}"


def _missing(owner: str, name: str, why: str) -> AiortcInternalsError:
    return AiortcInternalsError(
        f"aiortc {AIORTC_VERSION} has no {_shown(owner, name)} ({why}); "
        "media/aiortc_internals.py must follow the upgrade")


def _private(obj: object, owner: str, name: str, expected: type[_T], why: str) -> _T:
    """`obj`'s private attribute `name` (as Python spells it), checked to be an `expected`."""
    value = getattr(obj, name, _ABSENT)
    if value is _ABSENT:
        raise _missing(owner, name, why)
    if not isinstance(value, expected):
        raise AiortcInternalsError(
            f"aiortc {AIORTC_VERSION}'s {_shown(owner, name)} is a {type(value).__name__}, "
            f"not a {expected.__name__} ({why})")
    return value


def _method(obj: object, owner: str, name: str, why: str) -> Callable[..., Any]:
    method = getattr(obj, name, _ABSENT)
    if method is _ABSENT:
        raise _missing(owner, name, why)
    if not callable(method):
        raise AiortcInternalsError(
            f"aiortc {AIORTC_VERSION}'s {_shown(owner, name)} is not a method ({why})")
    return method


def _coroutine_method(
    obj: object, owner: str, name: str, why: str
) -> Callable[..., Coroutine[Any, Any, Any]]:
    method = _method(obj, owner, name, why)
    if not inspect.iscoroutinefunction(method):
        raise AiortcInternalsError(
            f"aiortc {AIORTC_VERSION}'s {_shown(owner, name)} is not a coroutine method ({why})")
    return method


def negotiated_codecs(transceiver: RTCRtpTransceiver) -> list[RTCRtpCodecParameters]:
    """The codecs negotiated for `transceiver`, the one its sender uses first (empty before
    negotiation)."""
    return _private(transceiver, "RTCRtpTransceiver", "_codecs", list,
                    "the negotiated codecs, which the sender takes the first of")


def jitter_buffer(receiver: RTCRtpReceiver) -> JitterBuffer:
    """The jitter buffer `receiver` holds incoming packets in before decoding."""
    return _private(receiver, "RTCRtpReceiver", _JITTER_BUFFER, JitterBuffer,
                    "the receiver's jitter buffer, replaced to hold fewer packets")


def replace_jitter_buffer(receiver: RTCRtpReceiver, capacity: int, prefetch: int) -> None:
    """Give `receiver` a jitter buffer of `capacity` packets that holds `prefetch` of them
    before releasing one (replace it before the first packet arrives)."""
    jitter_buffer(receiver)  # loud if the attribute moved: setting it would go unnoticed
    setattr(receiver, _JITTER_BUFFER, JitterBuffer(capacity, prefetch=prefetch))


class LoopDecoder:
    """Stands in for a receiver's queue to its decoder thread: each encoded frame `put` is
    decoded at once, in the event loop, and its frames are queued for the remote track; the
    end of the stream (None) goes on to aiortc's thread, which ends the track after the frames
    already queued. The thread, started when the connection comes up (after this replaced the
    queue it is given), waits on the queue it replaced: it sees nothing but the end."""

    def __init__(self, thread_queue: queue.Queue[Any], frames: asyncio.Queue[Any],
                 kind: str, decoder_for: DecoderFor = get_decoder) -> None:
        self._thread_queue = thread_queue
        self._frames = frames
        self._kind = kind
        self._decoder_for = decoder_for
        self._decoder: Decoder | None = None
        self._codec_name: str | None = None
        self.decoded = 0  # frames handed to the track
        self.empty = 0  # empty payloads skipped
        self.failed = 0  # frames skipped because decoding them raised

    def get(self) -> Any:
        """aiortc's decoder thread waits here: for the end of the stream, only."""
        return self._thread_queue.get()

    def put(self, task: tuple[RTCRtpCodecParameters, JitterFrame] | None) -> None:
        if task is None:
            self._thread_queue.put(None)
            return
        codec, encoded = task
        if not encoded.data:  # padding only, no audio
            # PyAV takes an empty packet for the end of the stream: the decoder would refuse
            # every later frame of the call (aiortc's own thread has this flaw).
            self.empty += 1
            return
        if self._decoder is None or codec.name != self._codec_name:
            self._decoder, self._codec_name = self._decoder_for(codec), codec.name
        try:
            frames = self._decoder.decode(encoded)
        except Exception as exc:  # keep the decoder, skip the frame (as aiortc's thread does)
            # Anything raised here would end the DTLS transport's receive loop, the whole call:
            # a frame that cannot be decoded costs that frame only.
            self.failed += 1
            if self.failed & (self.failed - 1) == 0:  # the 1st, 2nd, 4th...: a garbage stream
                logger.warning("%s frame could not be decoded (%s, %d so far): %r",  # logs little
                               codec.name, self._kind, self.failed, exc)
            return
        for frame in frames:
            self._frames.put_nowait(frame)
        self.decoded += len(frames)


def decode_in_loop(receiver: RTCRtpReceiver, decoder_for: DecoderFor = get_decoder
                   ) -> LoopDecoder:
    """Have `receiver` decode its packets in the event loop rather than in its thread, with
    `decoder_for(codec)` (aiortc's decoders by default); again: the decoder it has."""
    decoder = loop_decoder(receiver)
    if decoder is not None:
        return decoder
    thread_queue = _private(receiver, "RTCRtpReceiver", _DECODER_QUEUE, queue.Queue,
                            "the queue of encoded frames to the decoder thread")
    frames = remote_track_queue(receiver.track)
    if frames is None:
        raise AiortcInternalsError(f"aiortc {AIORTC_VERSION}'s RTCRtpReceiver.track is not a "
                                   "RemoteStreamTrack (its decoded frames' queue)")
    decoder = LoopDecoder(thread_queue, frames, receiver.track.kind, decoder_for)
    setattr(receiver, _DECODER_QUEUE, decoder)
    return decoder


def loop_decoder(receiver: RTCRtpReceiver) -> LoopDecoder | None:
    """The LoopDecoder `receiver` was given, if any."""
    decoder = getattr(receiver, _DECODER_QUEUE, None)
    return decoder if isinstance(decoder, LoopDecoder) else None


def wrap_data_channel_receive(
    sctp: RTCSctpTransport, wrap: Callable[[DataChannelReceive], DataChannelReceive]
) -> None:
    """Route every data-channel message `sctp` receives through `wrap(aiortc's receive)`."""
    receive = _coroutine_method(sctp, "RTCSctpTransport", _DATA_CHANNEL_RECEIVE,
                                "where every data-channel message is decoded")
    setattr(sctp, _DATA_CHANNEL_RECEIVE, wrap(receive))


def data_channel_backlog(channel: RTCDataChannel) -> bool:
    """Whether `channel`'s SCTP transport still holds data queued, in flight or not yet
    acknowledged by the peer."""
    sctp = channel.transport
    why = "data not yet acknowledged by the peer"
    # All three looked up every time, so a moved one is an error whatever the others hold.
    queues = [_private(sctp, "RTCSctpTransport", name, deque, why)
              for name in ("_data_channel_queue", "_outbound_queue", "_sent_queue")]
    return bool(channel.bufferedAmount) or any(queues)


def remote_track_queue(track: MediaStreamTrack) -> asyncio.Queue[Any] | None:
    """The queue of decoded frames aiortc keeps for a remote track (None ends the track);
    None for a track that is not aiortc's remote track, which has no such queue."""
    if not isinstance(track, RemoteStreamTrack):
        return None
    return _private(track, "RemoteStreamTrack", "_queue", asyncio.Queue,
                    "the unbounded queue of decoded frames")


def watch_rtp_packets(receiver: RTCRtpReceiver, on_packet: Callable[[RtpPacket], None]) -> None:
    """Call `on_packet` with every RTP packet `receiver` gets, before its jitter buffer."""
    handle = _coroutine_method(receiver, "RTCRtpReceiver", _HANDLE_RTP_PACKET,
                               "where each RTP packet enters the receiver")

    async def watched(packet: RtpPacket, arrival_time_ms: int) -> None:
        on_packet(packet)
        await handle(packet, arrival_time_ms)

    setattr(receiver, _HANDLE_RTP_PACKET, watched)


def take_rtp_packets(receiver: RTCRtpReceiver, on_packet: Callable[[RtpPacket], None]) -> None:
    """Hand every RTP packet `receiver` gets to `on_packet` instead of its jitter buffer and
    decoder: its remote track then never yields a frame."""
    _coroutine_method(receiver, "RTCRtpReceiver", _HANDLE_RTP_PACKET,
                      "where each RTP packet enters the receiver")

    async def taken(packet: RtpPacket, arrival_time_ms: int) -> None:
        on_packet(packet)

    setattr(receiver, _HANDLE_RTP_PACKET, taken)


def stun_server(gatherer: RTCIceGatherer) -> tuple[str, int] | None:
    """The STUN server `gatherer` queries for server-reflexive candidates (None: none)."""
    connection = _private(gatherer, "RTCIceGatherer", "_connection", Connection,
                          "the ICE agent, which holds the STUN server")
    return connection.stun_server


# What a peer connection offers and accepts for DTMF: 8 kHz beside G.711 (SIP bridges), 48 kHz
# beside Opus (browsers' RTCDTMFSender). Payload types clear of aiortc's video ones (97-102).
# aiortc's codec preferences match by name, not rate: preferring both rates offers one twice.
TELEPHONE_EVENTS = (
    RTCRtpCodecParameters(mimeType="audio/telephone-event", clockRate=8000, payloadType=126),
    RTCRtpCodecParameters(mimeType="audio/telephone-event", clockRate=48000, payloadType=110),
)


def accept_telephone_events() -> None:
    """Make every aiortc peer connection in this process offer and accept telephone-event
    (listed after the audio codecs, so our offers never make it the one a sender encodes
    with). Idempotent."""
    table = getattr(aiortc_codecs, "CODECS", _ABSENT)
    if not isinstance(table, dict) or not isinstance(table.get("audio"), list):
        raise _missing("aiortc.codecs", "CODECS['audio']", "the codecs peers negotiate from")
    audio: list[RTCRtpCodecParameters] = table["audio"]
    for codec in TELEPHONE_EVENTS:
        if not any(c.mimeType == codec.mimeType and c.clockRate == codec.clockRate
                   for c in audio):
            audio.append(codec)


def put_codecs_last(transceiver: RTCRtpTransceiver, names: set[str]) -> None:
    """Move `transceiver`'s negotiated codecs named in `names` after the others (aiortc's
    sender sends with the first, and an offer may list telephone-event first)."""
    negotiated_codecs(transceiver).sort(key=lambda codec: codec.name in names)


def divert_rtp_packets(receiver: RTCRtpReceiver, payload_types: set[int],
                       on_packet: Callable[[RtpPacket], None]) -> None:
    """Hand `receiver`'s RTP packets of `payload_types` to `on_packet` instead of aiortc: they
    never reach its statistics, jitter buffer or decoder (nor the track's frames)."""
    handle = _coroutine_method(receiver, "RTCRtpReceiver", _HANDLE_RTP_PACKET,
                               "where each RTP packet enters the receiver")

    async def diverted(packet: RtpPacket, arrival_time_ms: int) -> None:
        if packet.payload_type in payload_types:
            on_packet(packet)
        else:
            await handle(packet, arrival_time_ms)

    setattr(receiver, _HANDLE_RTP_PACKET, diverted)


async def send_rtp(sender: RTCRtpSender, packet: RtpPacket) -> None:
    """Send `packet` as it is on `sender`'s transport (SRTP-protected there); ConnectionError
    when the transport is not connected."""
    transport: RTCDtlsTransport = sender.transport
    send = _coroutine_method(transport, "RTCDtlsTransport", "_send_rtp",
                             "where RTP leaves, SRTP-protected")
    await send(packet.serialize())
