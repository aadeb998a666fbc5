"""A SIP phone for tests: Debian's SIPp runs one of the project's scenarios (tests/sipp/) as
the phone's signalling and plays G.711 speech as its RTP; what the bridge sends the phone is
caught by an RTP recorder the scenario's SDP points at."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from aiortp.codecs import PcmuCodec

from tests.audio_fixtures import ESPEAK, SOX
from tests.conftest import REPO

SIPP = shutil.which("sipp") or "/usr/bin/sipp"  # Debian's sip-tester (Makefile: SYSTEM_PACKAGES)
SCENARIOS = Path(__file__).resolve().parent / "sipp"
SPEECH = "speech.ulaw"  # the name the scenarios play, in SIPp's working folder
LOUD = 300  # int16 amplitude above which received audio counts as the agent speaking


def phone_speech(text: str, folder: Path) -> Path:
    """`text` spoken by espeak-ng as raw G.711 u-law at 8 kHz, 0.5 s of silence before and
    1 s after, in `folder`/speech.ulaw (what the scenarios play)."""
    raw = folder / "speech.espeak.wav"
    subprocess.run([ESPEAK, "-w", str(raw), text], check=True, capture_output=True)
    path = folder / SPEECH
    subprocess.run([SOX, "-D", str(raw), "-r", "8000", "-c", "1", "-e", "u-law", "-t", "raw",
                    str(path), "gain", "-n", "-3", "pad", "0.5", "1"],
                   check=True, capture_output=True)
    raw.unlink()
    return path


def free_port(kind: int = socket.SOCK_DGRAM, also_tcp: bool = False) -> int:
    """A loopback port free now (for UDP, and TCP too when asked)."""
    while True:
        with socket.socket(socket.AF_INET, kind) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if not also_tcp:
            return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            try:
                tcp.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


@dataclass
class RtpRecorder(asyncio.DatagramProtocol):
    """Counts the RTP packets sent to the phone and how many carried sound (PCMU decoded), and
    keeps the PCMU payloads by RTP timestamp (`audio` lays them out)."""

    packets: int = 0
    loud: int = 0
    payload_types: set[int] = field(default_factory=set)
    loud_by_source: Counter[int] = field(default_factory=Counter)  # by SSRC: one per call
    payloads: dict[int, bytes] = field(default_factory=dict)  # PCMU by RTP timestamp
    _codec: PcmuCodec = field(default_factory=PcmuCodec)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) < 12 or data[0] >> 6 != 2:
            return  # not RTP
        self.packets += 1
        payload_type = data[1] & 0x7F
        self.payload_types.add(payload_type)
        if payload_type == 0:
            self.payloads[int.from_bytes(data[4:8], "big")] = data[12:]
            pcm = self.pcmu(data[12:])
            if pcm.size and int(np.abs(pcm.astype(np.int32)).max()) > LOUD:
                self.loud += 1
                self.loud_by_source[int.from_bytes(data[8:12], "big")] += 1


    def audio(self) -> np.ndarray:
        """What the phone heard (one call), 8 kHz int16 laid out by RTP timestamp, lost packets
        as silence; each payload decoded as PCMU."""
        if not self.payloads:
            return np.zeros(0, np.int16)
        first = min(self.payloads)
        end = max(at - first + len(p) for at, p in self.payloads.items())
        audio = np.zeros(end, np.int16)
        for at, payload in self.payloads.items():
            audio[at - first:at - first + len(payload)] = self.pcmu(payload)
        return audio

    def pcmu(self, payload: bytes) -> np.ndarray:
        return np.frombuffer(self._codec.decode(payload), "<i2")


@contextlib.asynccontextmanager
async def recording_rtp() -> AsyncIterator[tuple[int, RtpRecorder]]:
    """An RTP recorder on a free loopback port, for the block: (its port, what it heard)."""
    port = free_port()
    transport, recorder = await asyncio.get_running_loop().create_datagram_endpoint(
        RtpRecorder, local_addr=("127.0.0.1", port))
    try:
        yield port, recorder
    finally:
        transport.close()


@contextlib.asynccontextmanager
async def sipp_call(scenario: str, target: str, folder: Path, rtp_sink: int, *extra: str,
                    calls: int = 1) -> AsyncIterator[asyncio.subprocess.Process]:
    """SIPp placing `calls` calls at once to `target` (HOST:PORT) with tests/sipp/`scenario`,
    from `folder` (where speech.ulaw lies); its exit status says whether every call held.
    Killed if still running when the block ends (a test that failed half-way)."""
    sipp = await asyncio.create_subprocess_exec(
        SIPP, target, "-sf", str(SCENARIOS / scenario), "-s", "1000",
        "-m", str(calls), "-l", str(calls), "-r", str(calls),
        "-i", "127.0.0.1", "-mi", "127.0.0.1", "-mp", str(free_port()),
        "-p", str(free_port()), "-key", "rtp_sink", str(rtp_sink), "-nostdin",
        "-timeout", "90", "-timeout_error", *extra,
        cwd=folder, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        yield sipp
    finally:
        if sipp.returncode is None:
            sipp.kill()
            await sipp.wait()


async def sipp_result(sipp: asyncio.subprocess.Process, timeout_s: float) -> tuple[int, str]:
    """SIPp's exit status and the end of its output (its screen and errors)."""
    out, _ = await asyncio.wait_for(sipp.communicate(), timeout_s)
    return int(sipp.returncode or 0), out.decode(errors="replace")[-3000:]


@contextlib.asynccontextmanager
async def running_bridge(server_url: str, *extra: str) -> AsyncIterator[str]:
    """`omnivox sip` (its own process, `extra` flags added) on a loopback port, bridging to
    `server_url`, for the block: its HOST:PORT. Its log is echoed (shown for failures)."""
    port = free_port(also_tcp=True)
    rtp = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent.cli", "sip", "--listen", f"127.0.0.1:{port}",
        "--server", server_url, "--rtp-ports", f"{rtp}-{rtp + 40}", *extra,
        cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert process.stdout is not None
    seen: list[str] = []
    while not any("omnivox sip: listening" in line for line in seen):
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        assert line, f"omnivox sip exited ({await process.wait()}): {''.join(seen)}"
        seen.append(line)
    drain = asyncio.create_task(_echo(process.stdout))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        drain.cancel()


async def _echo(stream: asyncio.StreamReader) -> None:
    """Read the bridge's log as it comes (a full pipe would block it)."""
    while line := await stream.readline():
        print("bridge:", line.decode().rstrip())
