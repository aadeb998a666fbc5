"""`omnivox sip`: the command line of the SIP bridge."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any

from agent.config import add_api_key_option
from agent.sip.listener import SipListener
from agent.sip.settings import (
    BridgeSettings,
    auth_user,
    listen_address,
    number_session,
    port_range,
    read_auth_file,
    read_session,
)


def add_parser(commands: Any) -> argparse.ArgumentParser:
    sip: argparse.ArgumentParser = commands.add_parser(
        "sip", help="bridge SIP calls (G.711 over RTP) to an omnivox server over WebRTC")
    sip.add_argument("--listen", required=True, metavar="HOST:PORT",
                     help="where SIP is answered (UDP and TCP), e.g. 0.0.0.0:5060")
    sip.add_argument("--server", required=True, metavar="URL",
                     help="the omnivox server calls are bridged to, e.g. http://127.0.0.1:8000")
    add_api_key_option(sip)
    sip.add_argument("--media-ip", default=None,
                     help="the address phones send RTP to (default: the --listen host; "
                     "needed when listening on 0.0.0.0)")
    sip.add_argument("--rtp-ports", default="20000-30000", metavar="LOW-HIGH",
                     help="the UDP ports RTP is taken from, two per call (default: 20000-30000)")
    sip.add_argument("--transport", choices=("udp", "tcp", "both"), default="both",
                     help="SIP transports answered (default: both)")
    sip.add_argument("--max-calls", type=int, default=16,
                     help="calls bridged at once; more get 486 Busy Here (default: 16)")
    sip.add_argument("--session", type=Path, default=None, metavar="FILE",
                     help="a JSON session object sent with every call (default: the server's "
                     "profile defaults)")
    sip.add_argument("--number", action="append", default=[], metavar="NUMBER=FILE",
                     help="the session of calls to NUMBER (the INVITE's user part); repeatable")
    sip.add_argument("--auth", action="append", default=[], metavar="USER:PASSWORD",
                     help="digest auth: INVITEs must carry this user's credentials (401 "
                     "challenge otherwise); repeatable")
    sip.add_argument("--auth-file", type=Path, default=None, metavar="FILE",
                     help="digest auth users as USER:PASSWORD lines (kept off the command line)")
    sip.add_argument("--realm", default="omnivox", help="the digest auth realm (default: omnivox)")
    return sip


def bridge_settings(args: argparse.Namespace) -> BridgeSettings:
    """The settings the flags ask for; BridgeSettingsError naming the first bad one."""
    host, port = listen_address(args.listen)
    transports = ("udp", "tcp") if args.transport == "both" else (args.transport,)
    return BridgeSettings(
        listen_host=host, listen_port=port, server_url=args.server.rstrip("/"),
        api_key=args.api_key, media_ip=args.media_ip, rtp_ports=port_range(args.rtp_ports),
        transports=transports, max_calls=args.max_calls,
        session=read_session(args.session) if args.session else None,
        number_sessions=dict(number_session(text) for text in args.number),
        auth_users={**(read_auth_file(args.auth_file) if args.auth_file else {}),
                    **dict(auth_user(text) for text in args.auth)},
        auth_realm=args.realm)


def run(settings: BridgeSettings) -> int:
    asyncio.run(serve(settings))
    return 0


async def serve(settings: BridgeSettings) -> None:
    """Bridge calls until SIGINT or SIGTERM, then end every call (a BYE to each phone)."""
    listener = SipListener(settings)
    await listener.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"omnivox sip: listening on {settings.listen_host}:{settings.listen_port} "
          f"({'+'.join(settings.transports)}), bridging to {settings.server_url}", flush=True)
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await listener.stop()
