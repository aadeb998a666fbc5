"""The server side of `omnivox bench calls`: an `omnivox serve` process to measure, and a watch on
it while the callers run (health round trips, the API process's memory, its /metrics).

The server is a separate process on purpose: the load generator's own work must not be counted
as the server's, and the API process's memory (RSS) is then its alone (the stage workers are
processes of their own and are not counted).
"""

from __future__ import annotations

import contextlib
import math
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from pipeline import environment

LAG_METRIC = "omnivox_event_loop_lag_seconds"  # histogram (agent/ops/metrics.py)
LAG_P99_METRIC = "omnivox_event_loop_lag_p99_seconds"  # gauge: the last minute's p99
TTFA_METRIC = "omnivox_time_to_first_audio_seconds"  # histogram: VAD close -> first audio sent
DROPPED_METRIC = "omnivox_calls_dropped"  # counter, by reason
REFUSED_METRIC = "omnivox_calls_refused"  # counter, by reason
PREEMPTIVE_METRIC = "omnivox_preemptive_replies_total"  # counter, by outcome


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # an AF_INET socket's name is (host, port)
        return port


class ServerProcess:
    """`omnivox serve` on a free loopback port, as a child process, until the block ends.

    Entering waits until /readyz says every stage is ready (engines load for tens of seconds;
    the local family's models are built on first use); leaving sends SIGTERM (the server ends
    its calls and stops its workers) and waits for the exit. The server's output goes to a log
    file whose tail is shown when it fails.
    """

    def __init__(self, profile: str, *, models_dir: Path | None = None, max_calls: int = 16,
                 sequential: bool = False, ready_timeout_s: float = 900.0,
                 log_path: Path | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self.profile = profile
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.sequential = sequential
        self.ready_timeout_s = ready_timeout_s
        self._scratch = tempfile.TemporaryDirectory(prefix="omnivox-bench-server-")
        self.log_path = log_path or Path(self._scratch.name) / "server.log"
        self.command = [sys.executable, "-m", "agent.cli", "serve", "--profile", profile,
                        "--port", str(self.port), "--max-calls", str(max_calls),
                        "--data-dir", str(Path(self._scratch.name) / "data"),
                        "--log-level", "warning", *extra_args]
        if models_dir is not None:
            self.command += ["--models-dir", str(models_dir)]
        if sequential:
            self.command.append("--sequential-stages")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def __enter__(self) -> ServerProcess:
        env = environment.child_environment(
            {"VLLM_LOGGING_LEVEL": environment.get("VLLM_LOGGING_LEVEL") or "WARNING"})
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within timeout_s; the exit code."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._scratch.cleanup()
        return process.returncode

    def log_tail(self, chars: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def _wait_ready(self) -> None:
        assert self.process is not None
        what = "sequential stages" if self.sequential else "cascade"
        print(f"omnivox bench: starting `omnivox serve --profile {self.profile}` ({what}) at "
              f"{self.url}; waiting for it to be ready (models and engines load)...", flush=True)
        deadline = time.monotonic() + self.ready_timeout_s
        with httpx.Client(base_url=self.url, timeout=5.0) as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the server exited with {self.process.returncode} while "
                                       f"starting:\n{self.log_tail()}")
                try:
                    reply = http.get("/readyz")
                except httpx.TransportError:
                    reply = None
                if reply is not None and reply.status_code == 200:
                    return
                if reply is not None and any(stage.get("state") == "failed"
                                             for stage in reply.json()["stages"].values()):
                    raise RuntimeError(f"the pipeline failed to start: {reply.json()['detail']}")
                time.sleep(0.5)
        raise TimeoutError(f"the server was not ready within {self.ready_timeout_s:.0f} s:\n"
                           f"{self.log_tail()}")


def wait_calls_ended(url: str, timeout_s: float = 60.0, headers: dict[str, str] | None = None
                     ) -> bool:
    """Wait until the server holds no call (its /readyz `calls`); False if it still does."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, timeout=5.0, headers=headers) as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                if http.get("/readyz").json()["calls"] == 0:
                    return True
            time.sleep(0.5)
    return False


# -- Prometheus text -------------------------------------------------------------------------

CALL_WORKER = "call-worker"  # the command of a call-worker process (agent/calls/workers.py)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(http: httpx.Client) -> Samples | None:
    """Every sample of the server's /metrics by (name, labels); None when it has none."""
    try:
        reply = http.get("/metrics")
    except httpx.HTTPError:
        return None
    if reply.status_code != 200:
        return None
    return parse_samples(reply.text)


def parse_samples(text: str) -> Samples:
    """Prometheus text exposition -> {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def histogram_quantile(q: float, before: Samples, after: Samples, name: str) -> float | None:
    """The q-quantile of what histogram `name` observed between two scrapes (linear inside the
    bucket, as Prometheus's histogram_quantile does); None if it observed nothing."""
    buckets: dict[float, float] = {}
    for (sample, labels), value in after.items():
        if sample != f"{name}_bucket":
            continue
        le = float(dict(labels)["le"])
        buckets[le] = buckets.get(le, 0.0) + value - before.get((sample, labels), 0.0)
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for upper in bounds:
        count = buckets[upper]
        if count >= rank:
            if math.isinf(upper):
                return lower  # beyond the last finite bucket: its bound is all we know
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = upper, count
    return lower


def counter_delta(before: Samples, after: Samples, name: str) -> float:
    """How much a counter (all its labels together) grew between two scrapes."""
    names = (name, f"{name}_total")
    return sum(value - before.get(key, 0.0) for key, value in after.items() if key[0] in names)


def by_label(before: Samples, after: Samples, name: str, label: str) -> dict[str, float]:
    """How much each of a counter's `label` values grew between two scrapes."""
    return {dict(labels)[label]: value - before.get((sample, labels), 0.0)
            for (sample, labels), value in after.items()
            if sample == name and label in dict(labels)}


def gauge(samples: Samples, name: str) -> float | None:
    return next((v for (sample, _), v in samples.items() if sample == name), None)


# -- the watch -------------------------------------------------------------------------------

@dataclass
class WatchSample:
    at: float  # monotonic s
    healthz_s: float | None  # round trip of GET /healthz (None: no answer)
    rss: int | None  # the API process's resident memory, bytes (None: not ours to see)


@dataclass
class ServerWatch:
    """Samples the server every `interval_s` in a thread while the callers run: /healthz round
    trips (an upper bound of its event loop's lag, from outside), and the API process's RSS
    when its pid is known. `snapshot()` scrapes /metrics (None where the server has none)."""

    url: str
    pid: int | None = None
    interval_s: float = 0.5
    headers: dict[str, str] | None = None
    samples: list[WatchSample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> ServerWatch:
        self._thread = threading.Thread(target=self._run, name="bench-server-watch",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def snapshot(self) -> Samples | None:
        with httpx.Client(base_url=self.url, timeout=10.0, headers=self.headers) as http:
            return scrape(http)

    def cpu(self) -> tuple[float, float, float] | None:
        """(when, CPU seconds of the call plane: the API process and its call workers, of its
        other children: the stage workers and their engines) so far; None when the server's
        pid is not known."""
        if self.pid is None:
            return None
        with contextlib.suppress(psutil.Error):
            api = psutil.Process(self.pid)
            calls = stages = 0.0
            for child in api.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    times = child.cpu_times()
                    if CALL_WORKER in child.cmdline():
                        calls += times.user + times.system
                    else:
                        stages += times.user + times.system
            times = api.cpu_times()
            return time.monotonic(), times.user + times.system + calls, stages
        return None

    def between(self, t0: float, t1: float) -> list[WatchSample]:
        return [s for s in list(self.samples) if t0 <= s.at <= t1]

    def _run(self) -> None:
        process = psutil.Process(self.pid) if self.pid is not None else None
        with httpx.Client(base_url=self.url, timeout=10.0, headers=self.headers) as http:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    http.get("/healthz")
                    healthz = time.monotonic() - began
                except httpx.HTTPError:
                    healthz = None
                rss = None
                if process is not None:
                    with contextlib.suppress(psutil.Error):
                        rss = process.memory_info().rss
                self.samples.append(WatchSample(began, healthz, rss))
                self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))


def server_figures(watch: ServerWatch, t0: float, t1: float, before: Samples | None,
                   after: Samples | None, cpu_before: tuple[float, float, float] | None = None,
                   cpu_after: tuple[float, float, float] | None = None) -> dict[str, Any]:
    """The server's side of one level: loop lag (its own histogram, when it has /metrics),
    health round trips, RSS and CPU (seen from outside) between t0 and t1."""
    import numpy as np

    samples = watch.between(t0, t1)
    healthz = [s.healthz_s * 1e3 for s in samples if s.healthz_s is not None]
    rss = [s.rss / 2**20 for s in samples if s.rss is not None]
    out: dict[str, Any] = {
        "metrics": after is not None,
        "event_loop_lag_p99_ms": None,
        "event_loop_lag_p99_last_minute_ms": None,
        "server_ttfa_p50_ms": None,
        "calls_dropped": None,
        "calls_refused": None,
        "preemptive_replies": None,
        "healthz_ms": ({"p50": float(np.percentile(healthz, 50)),
                        "p99": float(np.percentile(healthz, 99)), "max": max(healthz)}
                       if healthz else None),
        "healthz_unanswered": sum(1 for s in samples if s.healthz_s is None),
        "rss_mb": ({"first": rss[0], "last": rss[-1], "max": max(rss)} if rss else None),
        "cpu_cores": None,
    }
    if cpu_before is not None and cpu_after is not None:
        wall = max(1e-9, cpu_after[0] - cpu_before[0])
        out["cpu_cores"] = {"api": (cpu_after[1] - cpu_before[1]) / wall,
                            "stages": max(0.0, cpu_after[2] - cpu_before[2]) / wall}
    if before is not None and after is not None:
        lag = histogram_quantile(0.99, before, after, LAG_METRIC)
        ttfa = histogram_quantile(0.5, before, after, TTFA_METRIC)
        recent = gauge(after, LAG_P99_METRIC)
        out.update(
            event_loop_lag_p99_ms=None if lag is None else lag * 1e3,
            event_loop_lag_p99_last_minute_ms=None if recent is None else recent * 1e3,
            server_ttfa_p50_ms=None if ttfa is None else ttfa * 1e3,
            calls_dropped=counter_delta(before, after, DROPPED_METRIC),
            calls_refused=counter_delta(before, after, REFUSED_METRIC),
            preemptive_replies=by_label(before, after, PREEMPTIVE_METRIC, "outcome"),
        )
    return out
