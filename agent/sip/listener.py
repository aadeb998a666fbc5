"""The bridge's SIP side: a UAS on each transport (UDP, TCP), one BridgedCall per INVITE.

aiosipua parses and answers the SIP (100 Trying, the 2xx retransmitted until ACK over UDP,
BYE and CANCEL matched to their dialog, OPTIONS answered); this module only maps its
callbacks onto calls. The bridge keeps no state beyond its live calls.
"""

from __future__ import annotations

import asyncio
import logging

from aiortp import PortAllocator
from aiosipua import IncomingCall, SipRequest, SipUAS
from aiosipua.transport import SipTransport

from agent.sip.aiosipua_internals import reject_with_headers
from agent.sip.bridged_call import BridgedCall
from agent.sip.digest import DigestGuard
from agent.sip.reinvite import answer_reinvite
from agent.sip.settings import BridgeSettings
from agent.sip.tcp_transport import TcpTransport
from agent.sip.udp_transport import UdpTransport

log = logging.getLogger(__name__)

USER_AGENT = "omnivox-sip"
TRANSPORTS: dict[str, type[SipTransport]] = {"udp": UdpTransport, "tcp": TcpTransport}


class SipListener:
    """Answers SIP calls on the configured transports until `stop`."""

    def __init__(self, settings: BridgeSettings) -> None:
        self.settings = settings
        self.calls: dict[str, BridgedCall] = {}
        self._ports = PortAllocator(settings.rtp_ports)
        self._uas: list[SipUAS] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._guard = (DigestGuard(settings.auth_users, settings.auth_realm)
                       if settings.auth_users else None)

    async def start(self) -> None:
        address = (self.settings.listen_host, self.settings.listen_port)
        for name in self.settings.transports:
            uas = SipUAS(TRANSPORTS[name](local_addr=address), user_agent=USER_AGENT)
            uas.on_invite = self._on_invite
            uas.on_bye = self._on_bye
            uas.on_cancel = self._on_cancel
            uas.on_reinvite = self._on_reinvite
            uas.on_ack_timeout = self._on_ack_timeout
            await uas.start()
            self._uas.append(uas)
        log.info("SIP bridge listening on %s:%d (%s), calls go to %s", *address,
                 "+".join(self.settings.transports), self.settings.server_url)

    async def stop(self) -> None:
        """End every call (BYE to each phone) and close the transports."""
        for call in list(self.calls.values()):
            call.end_from_phone("bridge stopping")
            call.sip.hangup()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for uas in self._uas:
            await uas.stop()

    def _on_invite(self, sip: IncomingCall) -> None:
        if self._guard is not None and not self._guard.admits(sip.invite):
            log.info("call %s: no valid credentials; 401 with a challenge", sip.call_id)
            reject_with_headers(sip, 401, "Unauthorized",
                                {"WWW-Authenticate": self._guard.challenge()})
            return
        if len(self.calls) >= self.settings.max_calls:
            log.warning("call %s refused: %d calls live", sip.call_id, len(self.calls))
            sip.reject(486, "Busy Here")
            return
        call = BridgedCall(sip, self.settings, self._ports, self.settings.listen_host)
        self.calls[sip.call_id] = call
        task = asyncio.get_running_loop().create_task(self._run(call))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, call: BridgedCall) -> None:
        try:
            await call.run()
        except Exception:
            log.exception("call %s failed", call.call_id)
            call.sip.hangup()
        finally:
            self.calls.pop(call.call_id, None)

    def _on_bye(self, sip: IncomingCall, request: SipRequest) -> None:
        call = self.calls.get(sip.call_id)
        if call is not None:
            call.end_from_phone("BYE")

    def _on_cancel(self, request: SipRequest, addr: tuple[str, int]) -> None:
        call = self.calls.get(request.call_id or "")
        if call is not None:
            call.end_from_phone("CANCEL")

    def _on_ack_timeout(self, sip: IncomingCall) -> None:
        call = self.calls.get(sip.call_id)
        if call is not None:
            call.end_from_phone("no ACK")

    def _on_reinvite(self, sip: IncomingCall) -> None:
        call = self.calls.get(sip.call_id)
        if call is None or call.phone is None:
            return
        answer_reinvite(sip, call.phone, self.settings.announced_ip)
