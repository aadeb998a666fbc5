"""`omnivox bench rtp`: real aiortc peer pairs on loopback (real Opus packets, SRTP, UDP) carry
their packets both ways, and the figures are this process's CPU per packet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def bench_rtp(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli", "bench", "rtp", *flags],
                          capture_output=True, text=True, timeout=180)


def test_every_receiver_gets_its_packets_and_the_cpu_per_packet_is_reported(
    tmp_path: Path,
) -> None:
    out = tmp_path / "rtp.json"
    run = bench_rtp("--pairs", "1,2", "--seconds", "1", "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "cpu us/packet" in run.stdout
    levels = json.loads(out.read_text())["levels"]
    assert [level["pairs"] for level in levels] == [1, 2]
    for level in levels:
        pairs, expected = level["pairs"], level["packets_expected"]
        assert level["calls_equivalent"] == 2 * pairs
        assert expected == pytest.approx(2 * pairs * 50 * level["seconds"], abs=1)
        # Each of the 2 * pairs receivers heard its peer through the second; a loop starved by
        # a busy machine sends late, not never (the senders keep an absolute clock).
        assert level["fewest_per_receiver"] >= 0.5 * expected / (2 * pairs), level
        # Counted once each: no more than the clocks sent, with room for a late burst.
        assert level["packets"] <= 1.25 * expected + 10, level
        assert level["cpu_us_per_packet"] > 0
        assert level["core_per_call"] == pytest.approx(level["cpu_us_per_packet"] / 20_000,
                                                       rel=0.01, abs=1e-4)


@pytest.mark.parametrize(("flags", "said"), [
    (("--pairs", "0"), "levels must be whole numbers >= 1"),
    (("--pairs", "two"), "not a comma-separated list of numbers"),
    (("--seconds", "0"), "--seconds takes a positive time"),
])
def test_levels_that_cannot_run_are_refused(flags: tuple[str, str], said: str) -> None:
    run = bench_rtp(*flags)
    assert run.returncode == 2
    assert said in run.stdout + run.stderr
