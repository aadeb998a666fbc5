"""One SIP call bridged to one server call: set up in order, relayed, ended together.

Setup: the phone's offer is answered first (so a phone with no G.711 is refused before the
server is bothered), then the server's call is placed with the codec the phone agreed on, and
only then is the INVITE answered 200: a server that refuses (full, draining, unreachable)
refuses the phone too, with a SIP status that says so. Either side ending ends the other: a
BYE or CANCEL from the phone hangs up the server's call; the server ending its call (hangup,
session limit, drain) sends the phone a BYE.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiortp import PortAllocator
from aiosipua import IncomingCall

from agent.sip.phone_leg import PhoneLeg, PhoneOfferError
from agent.sip.server_leg import ServerLeg, ServerRefusedError
from agent.sip.settings import BridgeSettings

log = logging.getLogger(__name__)


def sip_status(refused: ServerRefusedError) -> tuple[int, str]:
    """The SIP status a phone gets when the server refuses its call: 503 when the server is
    busy or not ready (the phone or its proxy may try another bridge), 502 otherwise."""
    if refused.status in (503, 504):
        return 503, "Service Unavailable"
    return 502, "Bad Gateway"


class BridgedCall:
    """Drives one call from INVITE to the end of both legs (`run`)."""

    def __init__(self, sip: IncomingCall, settings: BridgeSettings, ports: PortAllocator,
                 bind_ip: str) -> None:
        self.sip = sip
        self.settings = settings
        self._ports = ports
        self._bind_ip = bind_ip
        self.phone: PhoneLeg | None = None
        self.server: ServerLeg | None = None
        self.phone_ended = asyncio.Event()  # BYE, CANCEL or no ACK from the phone
        self.phone_end_reason = ""
        self.answered_at: float | None = None

    @property
    def call_id(self) -> str:
        return self.sip.call_id

    def end_from_phone(self, reason: str) -> None:
        """The phone left (BYE, CANCEL) or never confirmed (no ACK)."""
        if not self.phone_ended.is_set():
            self.phone_end_reason = reason
            self.phone_ended.set()

    async def run(self) -> None:
        try:
            if await self._set_up():
                await self._hold()
        finally:
            await self._tear_down()

    async def _set_up(self) -> bool:
        """Both legs up and the INVITE answered; False (the phone refused or gone) if not."""
        try:
            self.phone = await PhoneLeg.open(self.sip.sdp_offer, self.settings.announced_ip,
                                             self._bind_ip, self._ports)
        except PhoneOfferError as exc:
            log.info("call %s refused: %s", self.call_id, exc)
            self.sip.reject(488, "Not Acceptable Here")
            return False
        self.sip.ringing()
        self.server = ServerLeg(self.settings.server_url, self.settings.api_key,
                                self.phone.codec)
        try:
            await self.server.connect(self._session(), self.settings.connect_timeout_s)
        except ServerRefusedError as exc:
            status, reason = sip_status(exc)
            log.warning("call %s: the server refused it (%s: %s); answered %d",
                        self.call_id, exc.status or "unreachable", exc, status)
            if not self.phone_ended.is_set():
                self.sip.reject(status, reason)
            return False
        if self.phone_ended.is_set():  # cancelled while the server answered
            return False
        self.phone.on_audio = self.server.track.push
        self.phone.on_dtmf = self.server.press
        self.server.on_audio = self.phone.send
        self.sip.accept(self.phone.answer)
        self.answered_at = time.monotonic()
        log.info("call %s from %s bridged to server call %s (%s)", self.call_id,
                 self.sip.caller, self.server.call_id, self.phone.codec)
        return True

    async def _hold(self) -> None:
        """Relay until one side ends, then end the other."""
        assert self.server is not None
        phone_left = asyncio.ensure_future(self.phone_ended.wait())
        server_left = asyncio.ensure_future(self.server.ended.wait())
        try:
            await asyncio.wait({phone_left, server_left}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            phone_left.cancel()
            server_left.cancel()
        if self.phone_ended.is_set():
            log.info("call %s: phone ended it (%s)", self.call_id, self.phone_end_reason)
        else:
            log.info("call %s: server ended it (%s); BYE to the phone", self.call_id,
                     self.server.end_reason)
            self.sip.hangup()

    async def _tear_down(self) -> None:
        if self.server is not None:
            await self.server.hang_up()
        if self.phone is not None:
            await self.phone.close()
            held = time.monotonic() - self.answered_at if self.answered_at else 0.0
            log.info("call %s over after %.1f s: %d RTP packets from the phone, %d to it",
                     self.call_id, held, self.phone.received_packets, self.phone.sent_packets)

    def _session(self) -> dict[str, Any] | None:
        uri = self.sip.invite.uri or ""
        user = uri.split(":", 1)[-1].split("@", 1)[0] if "@" in uri else None
        return self.settings.session_for(user)
