"""agent/bench/pinning.py on real processes: a server's API process and its call workers go to
the call plane's CPUs, its other descendants (stage workers, engines) to the rest."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from agent.bench.pinning import pin_server, split_cpus
from agent.bench.server import CALL_WORKER

CPUS = sorted(os.sched_getaffinity(0))
SLEEPER = "import time; time.sleep(60)"
# A stand-in for a server: a second thread, a stage worker and a call worker (named as
# agent/calls/workers.py names its processes), each a real process.
SERVER = f"""
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
children = [subprocess.Popen([sys.executable, "-c", {SLEEPER!r}]),
            subprocess.Popen([sys.executable, "-c", {SLEEPER!r}, {CALL_WORKER!r}])]
print("ready", flush=True)
time.sleep(60)
"""


def cpus_of(process: psutil.Process) -> list[set[int]]:
    return [os.sched_getaffinity(thread.id) for thread in process.threads()]


@pytest.mark.skipif(len(CPUS) < 2, reason="a plane of its own needs 2 CPUs (CI has 2)")
def test_the_call_plane_and_the_rest_run_on_cpus_of_their_own() -> None:
    plane, rest = split_cpus(1)
    assert plane == {CPUS[0]} and rest == set(CPUS[1:])
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    api = psutil.Process(server.pid)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        pin_server(server.pid, plane, rest)
        children = api.children(recursive=True)
        worker = next(c for c in children if CALL_WORKER in c.cmdline())
        stage = next(c for c in children if CALL_WORKER not in c.cmdline())
        assert len(api.threads()) == 2
        assert cpus_of(api) == [plane, plane]
        assert cpus_of(worker) == [plane]
        assert cpus_of(stage) == [rest]
    finally:
        for child in api.children(recursive=True):
            child.kill()
        server.kill()
        server.wait()


@pytest.mark.parametrize("plane_cpus", [0, len(CPUS)])
def test_a_plane_without_a_cpu_or_leaving_none_for_the_rest_is_refused(plane_cpus: int) -> None:
    with pytest.raises(ValueError, match=f"takes 1 to {len(CPUS) - 1}"):
        split_cpus(plane_cpus)


@pytest.mark.parametrize(("flags", "said"), [
    (("--url", "http://127.0.0.1:9", "--call-plane-cpus", "1"), "pins the server it starts"),
    (("--call-plane-cpus", str(len(CPUS))), f"takes 1 to {len(CPUS) - 1}"),
])
def test_bench_calls_refuses_what_it_cannot_pin(flags: tuple[str, ...], said: str) -> None:
    run = subprocess.run([sys.executable, "-m", "agent.cli", "bench", "calls", *flags],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert said in run.stderr
