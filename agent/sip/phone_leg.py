"""The phone's side of a bridged call: the SDP answer to its INVITE and the RTP between us.

SDP offer/answer is aiosipua's (`CallSession` answers with the first G.711 codec the phone
offers, plus `telephone-event` when the phone offers it); RTP, its jitter buffer and G.711 are
aiortp's. Audio crosses this module as 8 kHz s16 PCM: what aiortc decodes from, and encodes
to, G.711 on the server's leg, so neither leg resamples.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable

from aiortp import PortAllocator
from aiosipua import SdpMessage, SdpNegotiationError
from aiosipua.rtp_bridge import CallSession

log = logging.getLogger(__name__)

# G.711's static payload types, in the order we prefer them when a phone offers both.
G711 = {0: "PCMU", 8: "PCMA"}
DTMF_PAYLOAD_TYPE = 101  # ours in the answer; the phone's own is read from its offer
JITTER_PREFETCH = 2  # packets held to put reordered ones back in order (40 ms)


class PhoneOfferError(ValueError):
    """An INVITE's SDP we cannot answer; the message says why (sent as a 488's reason)."""


class PhoneLeg:
    """RTP with the phone: received audio goes to `on_audio`, `send` plays audio to it."""

    def __init__(self, session: CallSession, ports: PortAllocator, port: int) -> None:
        self._session = session
        self._ports = ports
        self._port = port
        self._timestamp = secrets.randbits(32)
        self.answer: SdpMessage = session.sdp_answer  # the latest (a re-INVITE renews it)
        self.on_audio: Callable[[bytes], None] | None = None
        self.on_dtmf: Callable[[str, int], None] | None = None
        self.sending = True  # False while the phone holds the call (it takes no audio)
        self.received_packets = 0
        self.sent_packets = 0
        self._closed = False
        session.on_audio = self._received
        session.on_dtmf = self._dtmf

    @classmethod
    async def open(cls, offer: SdpMessage | None, media_ip: str, bind_ip: str,
                   ports: PortAllocator) -> PhoneLeg:
        """Answer `offer` on a fresh RTP port pair; PhoneOfferError when it has no G.711."""
        if offer is None:
            raise PhoneOfferError("the INVITE has no SDP offer (late offers are not supported)")
        if offer.audio is None or offer.rtp_address is None:
            raise PhoneOfferError("the SDP offer has no audio stream with an address")
        port, _ = await ports.allocate()
        try:
            session = CallSession(
                local_ip=bind_ip, rtp_port=port, offer=offer, advertised_ip=media_ip,
                supported_codecs=list(G711), dtmf_payload_type=DTMF_PAYLOAD_TYPE,
                jitter_prefetch=JITTER_PREFETCH)
            await session.start()
        except SdpNegotiationError as exc:
            await ports.release(port)
            raise PhoneOfferError(f"no G.711 codec offered (PCMU or PCMA): {exc}") from None
        except BaseException:
            await ports.release(port)
            raise
        return cls(session, ports, port)

    @property
    def codec(self) -> str:
        """The G.711 codec the phone and we agreed on: "PCMU" or "PCMA"."""
        return G711[self._session.chosen_payload_type]

    @property
    def port(self) -> int:
        return self._port

    @property
    def payload_type(self) -> int:
        return self._session.chosen_payload_type

    def renegotiated(self, answer: SdpMessage, remote: tuple[str, int], sending: bool) -> None:
        """A re-INVITE changed where the phone takes RTP, or put it on or off hold."""
        self.answer = answer
        self._session.update_remote(remote)
        self.sending = sending

    def send(self, pcm: bytes) -> None:
        """Play 8 kHz s16 PCM to the phone (encoded with the agreed codec), unless on hold."""
        if self._closed or not self.sending:
            return
        self._session.send_audio_pcm(pcm, self._timestamp)
        self._timestamp = (self._timestamp + len(pcm) // 2) & 0xFFFFFFFF
        self.sent_packets += 1

    def _received(self, pcm: bytes, timestamp: int) -> None:
        self.received_packets += 1
        if self.on_audio is not None:
            self.on_audio(pcm)

    def _dtmf(self, digit: str, duration: int) -> None:
        if self.on_dtmf is not None:
            self.on_dtmf(digit, duration)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._session.close()
        await self._ports.release(self._port)
