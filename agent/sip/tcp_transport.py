"""aiosipua's TCP SIP transport, answering each request on the connection it came in on.

aiosipua 0.7.1 routes every response by its top Via (sent-by, or received/rport when the phone
asked for rport); over TCP that names the phone's listening port, not the connection it
opened, so a phone that does not ask for rport (SIPp, many desk phones) never got an answer.
RFC 3261 18.2.2 says a response goes back on the request's connection: the connection of each
request is noted by its Via branch (the transaction), bounded, and used for its responses.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from aiosipua import SipRequest, SipResponse
from aiosipua.transport import TcpSipTransport

from agent.sip.aiosipua_internals import connected

REMEMBERED = 1024  # transactions whose connection is kept (the oldest are forgotten)


class TcpTransport(TcpSipTransport):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._origins: OrderedDict[str, tuple[str, int]] = OrderedDict()

    async def start(self) -> None:
        handle = self.on_message  # the UAS's, set before start

        def noted(message: SipRequest | SipResponse, addr: tuple[str, int]) -> None:
            if isinstance(message, SipRequest) and message.via and message.via[0].branch:
                self._origins[message.via[0].branch] = addr
                self._origins.move_to_end(message.via[0].branch)
                while len(self._origins) > REMEMBERED:
                    self._origins.popitem(last=False)
            if handle is not None:
                handle(message, addr)

        self.on_message = noted
        await super().start()

    def send_reply(self, response: SipResponse) -> None:
        branch = response.via[0].branch if response.via else None
        origin = self._origins.get(branch) if branch else None
        if origin is not None and connected(self, origin):
            self.send(response, origin)
        else:
            super().send_reply(response)
