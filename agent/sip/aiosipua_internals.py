"""aiosipua's private parts this bridge needs, reached here alone (tests/test_sip_parts.py
checks each, so an aiosipua upgrade that moves one fails there by name).

- `IncomingCall._send_response`: `reject()` sends no extra headers, and a digest challenge is
  a 401 with WWW-Authenticate.
- `SipTransport._dispatch`: parse a received message and hand it to `on_message`, for the UDP
  transport's own datagram protocol (udp_transport.py).
- `UdpSipTransport._udp_transport`: the datagram transport its `send` and `stop` use, set by
  that UDP transport's own `start`.
- `TcpSipTransport._connections`: the open connections by peer address, so a response goes
  back on its request's connection while it is open (tcp_transport.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect

from aiosipua import IncomingCall
from aiosipua.transport import SipTransport, TcpSipTransport, UdpSipTransport


def reject_with_headers(sip: IncomingCall, status: int, reason: str,
                        headers: dict[str, str]) -> None:
    """What `sip.reject(status, reason)` does, with `headers` added to the response."""
    sip._send_response(status, reason, extra_headers=headers)
    sip.dialog.terminate()


def dispatch(transport: SipTransport, data: bytes, addr: tuple[str, int]) -> None:
    """Parse `data` from `addr` and hand the message to the transport's `on_message`."""
    transport._dispatch(data, addr)


def keep_datagrams(transport: UdpSipTransport, datagrams: asyncio.DatagramTransport) -> None:
    """Have `transport` send over, and close at its stop, the endpoint its `start` made."""
    transport._udp_transport = datagrams


def connected(transport: TcpSipTransport, addr: tuple[str, int]) -> bool:
    """Whether `transport` still holds a connection from `addr`."""
    return addr in transport._connections


def _moved() -> list[str]:
    """The private parts above that this aiosipua lacks, each named with who needs it."""
    moved = []
    send = getattr(IncomingCall, "_send_response", None)
    if send is None or "extra_headers" not in inspect.signature(send).parameters:
        moved.append("IncomingCall._send_response(..., extra_headers=) (reject_with_headers)")
    handle = getattr(SipTransport, "_dispatch", None)
    if handle is None or list(inspect.signature(handle).parameters) != ["self", "data", "addr"]:
        moved.append("SipTransport._dispatch(data, addr) (dispatch: udp_transport.py)")
    if "_udp_transport" not in {f.name for f in dataclasses.fields(UdpSipTransport)}:
        moved.append("UdpSipTransport._udp_transport (keep_datagrams: udp_transport.py)")
    if "_connections" not in {f.name for f in dataclasses.fields(TcpSipTransport)}:
        moved.append("TcpSipTransport._connections (connected: tcp_transport.py)")
    return moved


def check() -> None:
    """Raise, naming each, if aiosipua no longer has a private part this module reaches."""
    moved = _moved()
    if moved:
        raise RuntimeError("aiosipua moved what agent/sip/aiosipua_internals.py reaches: "
                           + "; ".join(moved))
