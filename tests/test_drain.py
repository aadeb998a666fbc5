"""Graceful drain on SIGTERM, for real: a media-only server in its own process (calls answered
with a tone), a real aiortc call, then SIGTERM: new offers and /readyz refuse, the live call
goes on until it hangs up or the drain bound passes, and the process exits 0."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.audio_fixtures import read_wav, speech_wav
from tests.media_servers import free_port
from tests.rtc_client import ArrayAudioTrack, RtcCaller, dead_peer_offer

REPO = Path(__file__).resolve().parent.parent
SILENCE = np.zeros(48_000, np.int16)


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    path = speech_wav("what is the capital of france", tmp_path_factory.mktemp("drain") / "q.wav",
                      pad_before_s=0.3, pad_after_s=1.5)
    return read_wav(path)[0]


@contextlib.contextmanager
def drain_server(data_dir: Path, **settings: Any) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """This module run as a server process (main below); yields its URL and the process, whose
    merged output is kept in `data_dir/server.log`."""
    port = free_port()
    log_path = data_dir / "server.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.test_drain", "--port", str(port), "--settings",
             json.dumps({"data_dir": str(data_dir), **settings})],
            cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, text=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthy(url, process), 60, "/healthz")
        yield url, process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def healthy(url: str, process: subprocess.Popen[str]) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"server exited with {process.returncode}")
    with contextlib.suppress(httpx.TransportError):
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    return False


def wait_until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.1)
    raise TimeoutError(f"{what} not within {timeout} s")


async def connected_caller(url: str) -> RtcCaller:
    """A caller whose microphone is silent until the test gives it speech."""
    caller = RtcCaller(url, ArrayAudioTrack(SILENCE))
    await caller.connect()
    await caller.wait_for("session.created", timeout=15)
    return caller




def draining_readyz(url: str) -> httpx.Response | None:
    """/readyz once it says the server is draining (the signal reaches it asynchronously)."""
    reply = httpx.get(f"{url}/readyz", timeout=2)
    return reply if reply.status_code == 503 else None


def end_reason(data_dir: Path, call_id: str) -> str | None:
    with contextlib.closing(sqlite3.connect(data_dir / "records.sqlite3")) as db:
        row = db.execute("SELECT end_reason FROM calls WHERE call_id = ?", (call_id,)).fetchone()
    return row[0] if row else None


def log_lines(data_dir: Path, *needles: str) -> list[int]:
    """The line number of the first line holding each needle (-1: none)."""
    lines = (data_dir / "server.log").read_text().splitlines()
    return [next((i for i, line in enumerate(lines) if needle in line), -1) for needle in needles]


async def test_sigterm_drains_until_the_caller_hangs_up(
    tmp_path: Path, speech: np.ndarray
) -> None:
    # A bound far beyond the test: the exit can only come from the caller hanging up.
    with drain_server(tmp_path, drain_timeout_s=300) as (url, process):
        caller = await connected_caller(url)
        call_id = caller.location.rsplit("/", 1)[1]
        try:
            process.send_signal(signal.SIGTERM)
            readyz = wait_until(lambda: draining_readyz(url), 10, "/readyz 503")
            assert readyz.json()["status"] == "draining"
            assert "draining" in readyz.json()["detail"]
            async with httpx.AsyncClient(base_url=url) as http:
                refused = await http.post("/v1/realtime/calls", content=await dead_peer_offer(),
                                          headers={"Content-Type": "application/sdp"})
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "server_draining"
            assert int(refused.headers["Retry-After"]) > 0
            # The live call goes on: its speech is heard (events) and answered (the tone).
            caller.audio.replace(speech)
            await caller.wait_for("input_audio_buffer.speech_stopped", timeout=20)
            await caller_hears_tone(caller)
            assert process.poll() is None, "the server stopped with a call still up"
        finally:
            await caller.hang_up()
        assert process.wait(timeout=30) == 0
    assert end_reason(tmp_path, call_id) == "hangup"
    drain, drained = log_lines(tmp_path, "SIGTERM: draining, 1 live call", "drained: no live call")
    assert 0 <= drain < drained, (tmp_path / "server.log").read_text()[-3000:]


async def caller_hears_tone(caller: RtcCaller) -> None:
    """Wait for the responder's tone to reach the caller (loud frames after silence)."""
    deadline = time.monotonic() + 20
    while not caller.loud_bursts(threshold=3000):
        assert time.monotonic() < deadline, "no tone reached the caller"
        await asyncio.sleep(0.1)


async def test_drain_bound_closes_the_calls_left(tmp_path: Path) -> None:
    with drain_server(tmp_path, drain_timeout_s=2) as (url, process):
        caller = await connected_caller(url)
        call_id = caller.location.rsplit("/", 1)[1]
        try:
            process.send_signal(signal.SIGTERM)
            wait_until(lambda: draining_readyz(url), 10, "/readyz 503")
            # The caller never hangs up: the bound ends the drain, then the usual stop.
            assert process.wait(timeout=60) == 0
        finally:
            await caller.close()
    assert end_reason(tmp_path, call_id) == "server_shutdown"
    drain, bound = log_lines(tmp_path, "SIGTERM: draining, 1 live call", "drain bound of 2 s")
    assert 0 <= drain < bound, (tmp_path / "server.log").read_text()[-3000:]


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
async def test_second_signal_stops_at_once(tmp_path: Path, second: signal.Signals) -> None:
    with drain_server(tmp_path, drain_timeout_s=300) as (url, process):
        caller = await connected_caller(url)
        call_id = caller.location.rsplit("/", 1)[1]
        try:
            process.send_signal(signal.SIGTERM)
            wait_until(lambda: draining_readyz(url), 10, "/readyz 503")
            process.send_signal(second)
            assert process.wait(timeout=60) == 0  # long before the 300 s bound
        finally:
            await caller.close()
    assert end_reason(tmp_path, call_id) == "server_shutdown"
    assert log_lines(tmp_path, "drain bound", "drained:") == [-1, -1]


def main() -> int:
    """The server these tests start: media only, each utterance answered with a tone."""
    from agent.app import create_app, run_server
    from agent.config import Settings
    from agent.ops import logs
    from tests.responder import ToneResponder

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--settings", default="{}", help="Settings fields as a JSON object")
    args = parser.parse_args()
    settings = Settings(port=args.port, **json.loads(args.settings))
    logs.configure(settings.log_level, settings.log_format)
    return run_server(create_app(settings, handler_factory=ToneResponder), settings)


if __name__ == "__main__":
    sys.exit(main())
