"""Serving an omnivox app on a loopback port inside the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI


@dataclass
class Served:
    app: FastAPI
    url: str


@contextlib.asynccontextmanager
async def serve(app: FastAPI, port: int = 0) -> AsyncIterator[Served]:
    """Run uvicorn (lifespan included) on 127.0.0.1 and `port` (an ephemeral one unless told)
    until the block ends."""
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
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
