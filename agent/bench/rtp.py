"""`omnivox bench rtp`: what aiortc's per-packet path costs on its own, without a call's work.

A call's media is one 20 ms RTP packet each way. Its cost to the server (`omnivox bench calls`'
`srv cpu/call`) mixes the transport (aiortc's RTP packing and parsing, SRTP, aioice's ICE send
and receive, the event loop's wake-ups and the kernel's UDP) with the call's own work (Opus,
the resampler, the VAD, pacing, the turn). This bench measures the transport alone, so the two
can be told apart: N pairs of aiortc peer connections on loopback in this one process, each
side sending a real Opus packet every 20 ms on a clock of its own (as independent callers
would: pairs connect one after the other, so the clocks' phases differ), each receiver taking
its packets where aiortc would hand them to its jitter buffer (nothing decoded, as the light
callers do), on the event loop the server runs (uvicorn's choice: uvloop where installed).
Per level it reports the process's CPU per packet, one send and one receive:
about what a call's 20 ms costs its server in transport alone. N pairs send and receive as
many packets per 20 ms as a server with 2N calls.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection
from aiortc.rtp import RtpPacket
from uvicorn.loops.auto import auto_loop_factory

from agent.bench.command import concurrency_levels
from agent.bench.light_caller import PacketMicrophone, encode_opus
from agent.bench.speech import MIC_RATE
from media.aiortc_internals import take_rtp_packets

DEFAULT_PAIRS = (1, 4, 8, 16)
FRAME_US = 20_000  # one packet each way per call per 20 ms
SETTLE_S = 2.0  # after the last pair connects: ICE, DTLS and the first RTCP are done


@dataclass(frozen=True)
class RtpLevel:
    pairs: int
    calls_equivalent: int  # a server's calls with as many packets per 20 ms
    seconds: float
    packets: int  # received by all pairs in `seconds`
    packets_expected: int  # 2 per pair per 20 ms
    fewest_per_receiver: int  # the packets of the receiver that got the fewest
    cpu_us_per_packet: float  # this process's CPU: one send and one receive
    core_per_call: float  # a call's transport: one packet each way per 20 ms


def speech_packet() -> bytes:
    """One 20 ms Opus packet of noise at a speaking level (about the size of a voice's)."""
    noise = np.random.default_rng(0).normal(0, 3000, MIC_RATE // 50 * 3).astype(np.int16)
    return encode_opus(noise)[1]


async def _connect(payload: bytes, counts: list[int]) -> tuple[RTCPeerConnection, ...]:
    """Two peer connections sending `payload` to each other every 20 ms; each receiver counts
    its packets in an entry of its own, appended to `counts`."""
    pcs = RTCPeerConnection(), RTCPeerConnection()
    for pc in pcs:
        pc.addTrack(PacketMicrophone(lambda speaking, at: None, payload))

        @pc.on("track")
        def taken(track: MediaStreamTrack, pc: RTCPeerConnection = pc) -> None:
            receiver = next(t.receiver for t in pc.getTransceivers() if t.receiver.track is track)
            index = len(counts)
            counts.append(0)

            def count(packet: RtpPacket) -> None:
                counts[index] += 1

            take_rtp_packets(receiver, count)

    offerer, answerer = pcs
    await offerer.setLocalDescription(await offerer.createOffer())
    await answerer.setRemoteDescription(offerer.localDescription)
    await answerer.setLocalDescription(await answerer.createAnswer())
    await offerer.setRemoteDescription(answerer.localDescription)
    return pcs


async def measure(pairs: int, seconds: float, payload: bytes) -> RtpLevel:
    """One level: `pairs` pairs sending for `seconds` after they settle."""
    counts: list[int] = []
    connections = [pc for _ in range(pairs) for pc in await _connect(payload, counts)]
    try:
        await asyncio.sleep(SETTLE_S)
        before, cpu, wall = list(counts), time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        got = [after - was for after, was in zip(counts, before, strict=True)]
    finally:
        await asyncio.gather(*(pc.close() for pc in connections))
    if len(got) < 2 * pairs or not all(got):
        raise RuntimeError(f"of {pairs} aiortc pairs on loopback, {2 * pairs - sum(map(bool, got))}"
                           f" receivers got no packet in {wall:.1f} s")
    per_packet = cpu * 1e6 / sum(got)
    return RtpLevel(pairs=pairs, calls_equivalent=2 * pairs, seconds=round(wall, 3),
                    packets=sum(got), packets_expected=round(2 * pairs * wall * 50),
                    fewest_per_receiver=min(got), cpu_us_per_packet=round(per_packet, 1),
                    core_per_call=round(per_packet / FRAME_US, 4))


async def run_levels(levels: list[int], seconds: float) -> list[RtpLevel]:
    payload = speech_packet()
    return [await measure(pairs, seconds, payload) for pairs in levels]


def table(results: list[RtpLevel]) -> str:
    lines = ["pairs  as calls  packets (expected)  cpu us/packet  a call's transport, % of a core"]
    lines += [f"{r.pairs:5d}  {r.calls_equivalent:8d}  {r.packets:7d} ({r.packets_expected:8d})  "
              f"{r.cpu_us_per_packet:13.1f}  {100 * r.core_per_call:6.2f}%" for r in results]
    return "\n".join(lines)


def add_parser(bench_cmd: Any) -> None:
    """`omnivox bench rtp`'s flags."""
    rtp = bench_cmd.add_parser(
        "rtp", help="aiortc's per-packet path alone: CPU per packet of loopback peer pairs")
    rtp.add_argument("--pairs", type=concurrency_levels, default=list(DEFAULT_PAIRS),
                     help="peer pairs per level, comma-separated (default: 1,4,8,16)")
    rtp.add_argument("--seconds", type=float, default=10.0,
                     help="measured per level, after the pairs settle (default: %(default)s)")
    rtp.add_argument("--json", dest="json_path", type=Path, help="also write the figures here")


def command(args: Any, settings: Any) -> int:
    """`omnivox bench rtp` from its parsed flags."""
    if args.seconds <= 0:
        print(f"omnivox bench rtp: --seconds takes a positive time, not {args.seconds:g}")
        return 2
    for chatty in ("aioice", "aiortc"):  # every pair's ICE and DTLS steps: not the figures
        logging.getLogger(chatty).setLevel(logging.WARNING)
    with asyncio.Runner(loop_factory=auto_loop_factory()) as runner:
        loop = type(runner.get_loop())
        results = runner.run(run_levels(args.pairs, args.seconds))
    print(f"omnivox bench rtp: aiortc peer pairs on loopback in one process ({loop.__module__}), "
          "a 20 ms Opus packet each way per pair; CPU of this process per packet (one send "
          "and one receive)")
    print(table(results))
    if args.json_path:
        args.json_path.write_text(json.dumps({"levels": [asdict(r) for r in results]}, indent=2))
        print(f"omnivox bench rtp: results written to {args.json_path}")
    return 0
