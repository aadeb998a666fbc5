"""aiosipua's UDP SIP transport, started without its `connection_made` check.

aiosipua 0.7.1's UDP protocol asserts that the transport it is handed is an
`asyncio.DatagramTransport`; Python 3.11's selector event loop hands a datagram transport that
does not subclass it (3.12's does), so every start logged an AssertionError. The transport
itself works: `start` keeps what `create_datagram_endpoint` returns, as aiosipua's does.
Retire this when aiosipua drops the assertion or the project moves to Python 3.12.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiosipua.transport import UdpSipTransport

from agent.sip.aiosipua_internals import dispatch, keep_datagrams


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, owner: UdpSipTransport) -> None:
        self._owner = owner

    def datagram_received(self, data: bytes, addr: tuple[str, int] | Any) -> None:
        dispatch(self._owner, data, (str(addr[0]), int(addr[1])))


class UdpTransport(UdpSipTransport):
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Datagrams(self), local_addr=self.local_addr)
        keep_datagrams(self, transport)
