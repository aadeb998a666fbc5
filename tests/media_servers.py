"""Media-only omnivox servers with the settings a test chooses (limits, VAD): in the test's own
event loop, or as a separate process whose memory a test can measure on its own."""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from agent.app import create_app
from agent.calls.call import Call
from agent.config import Settings
from tests.responder import ToneResponder
from tests.rtc_client import RtcCaller
from tests.served import Served, serve

REPO = Path(__file__).resolve().parent.parent


@contextlib.asynccontextmanager
async def tone_server(settings: Settings) -> AsyncIterator[Served]:
    """A server in this event loop whose calls answer each utterance with a tone; the calls'
    responders are kept in `app.state.test_responders`, in call order."""
    responders: list[ToneResponder] = []

    def factory(call: Call) -> ToneResponder:
        responders.append(ToneResponder(call))
        return responders[-1]

    app = create_app(settings, handler_factory=factory)
    app.state.test_responders = responders
    async with serve(app) as served:
        yield served


def call_of(served: Served, caller: RtcCaller) -> Call | None:
    """The server's side of this caller's call, while the server holds it."""
    call: Call | None = served.app.state.calls.get(caller.call_id)
    return call


def responder_of(served: Served, caller: RtcCaller) -> ToneResponder:
    call = call_of(served, caller)
    assert call is not None, "the server no longer holds this call"
    assert isinstance(call.handler, ToneResponder), "the call has no tone responder"
    return call.handler


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def server_process(**settings: Any) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A media-only server (calls without a handler: VAD events only) in its own process:
    yields its base URL and the process; stopped with SIGTERM afterwards."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.media_servers", "--port", str(port),
         "--settings", json.dumps(settings)],
        cwd=REPO,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"media server exited with {process.returncode}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("media server did not answer /healthz in 60 s")
            time.sleep(0.1)
        yield url, process
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--settings", default="{}", help="Settings fields as a JSON object")
    args = parser.parse_args()
    settings = Settings(port=args.port, **json.loads(args.settings))
    uvicorn.run(create_app(settings), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
