"""Serving an omnivox app on a loopback port inside the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI


@dataclass
class Served:
    app: FastAPI
    url: str


@contextlib.asynccontextmanager
async def serve(app: FastAPI, port: int = 0, send_buffer: int | None = None
                ) -> AsyncIterator[Served]:
    """Run uvicorn (lifespan included) on 127.0.0.1 and `port` (an ephemeral one unless told)
    until the block ends. `send_buffer`: the kernel's send buffer of each connection, fixed
    (Linux otherwise grows it up to tcp_wmem's 4 MB for a client that does not read)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    sockets = None
    if send_buffer is not None:  # accepted connections inherit the listening socket's
        listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        listening.bind(("127.0.0.1", port))
        sockets = [listening]
    task = asyncio.create_task(server.serve(sockets))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Served(app=app, url=f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        await task
