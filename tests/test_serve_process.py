"""`omnivox serve` as a user runs it: a real process that answers /healthz at once, reports
/readyz 503 while the engines load and 200 once they are up, serves the page, and on SIGTERM
stops its stage workers and exits 0 with no process of its own left behind. What it printed
has none of the engines' known dependency noise."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from pipeline.engines.vllm_noise import LOGGING_CONFIG_ENV, WARNINGS_ENV
from tests.test_engine_noise import noise_in

pytestmark = pytest.mark.engines
OMNIVOX = Path(sys.executable).with_name("omnivox")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.2)
    raise TimeoutError(f"{what} not within {timeout} s")


def get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2)
    except httpx.TransportError:
        return None


def test_serve_health_readiness_and_clean_sigterm(tiny_models_dir: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # Not the noise settings this test process may have made for engines it started: the server
    # must make its own (the operator's would be kept as they are).
    env = {k: v for k, v in os.environ.items() if k not in (LOGGING_CONFIG_ENV, WARNINGS_ENV)}
    process = subprocess.Popen(
        [str(OMNIVOX), "serve", "--profile", "tiny", "--port", str(port),
         "--models-dir", str(tiny_models_dir), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        health = wait_for(lambda: get(f"{base}/healthz"), 60, "/healthz")
        assert health.status_code == 200
        early = get(f"{base}/readyz")
        assert early.status_code == 503  # engines take seconds to start; the API does not wait
        assert early.json()["status"] == "not_ready" and early.json()["detail"]
        ready = wait_for(lambda: (r := get(f"{base}/readyz")) and r.status_code == 200 and r,
                         300, "/readyz 200")
        assert set(ready.json()["stages"]) == {"thinker", "talker", "voicebox"}
        assert "<html" in get(f"{base}/").text.lower()
        children = psutil.Process(process.pid).children(recursive=True)
        titles = {" ".join(p.cmdline()).strip() for p in children}
        assert {"omnivox-thinker", "omnivox-talker", "omnivox-voicebox"} <= titles, titles
        family = [p.pid for p in children]

        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        print(f"\n[serve] SIGTERM to exit: {time.monotonic() - began:.1f} s")
        wait_for(lambda: not [p for p in family if psutil.pid_exists(p)
                              and psutil.Process(p).status() != psutil.STATUS_ZOMBIE],
                 10, "every child of the server to exit")
    finally:
        if process.poll() is None:
            process.kill()
        output = process.stdout.read() if process.stdout else ""
        if process.returncode not in (0, None):
            print(output[-4000:])
    # Its engines started without the known dependency noise, in every process that prints it
    # (pipeline.engines.vllm_noise), and vLLM's engine processes still print their other
    # warnings: the filter is exact.
    assert not noise_in(output), "\n".join(noise_in(output))
    assert re.search(r"\(EngineCore pid=\d+\) WARNING", output), output[-4000:]
