"""The CUDA IPC transport's tests as a GPU check runs them: pytest in a subprocess, its outcome
recorded, never raised (`omnivox bench gpu` and `omnivox bench gpu-torch`).

The transport's tests import the runtime's messaging (msgspec, zmq), which a GPU host lent for
checks may lack: a test file that cannot even be collected for a missing module is reported as
"not run: <module> not installed", the rest of the check unaffected.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[2] / "tests"
# the transport's own test, then its GPU half (which skips, saying why, without CUDA)
CUDA_IPC_TESTS = (TESTS / "test_cuda_ipc_transport.py", TESTS / "test_cuda_ipc_gpu.py")
MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")
NO_TESTS_RAN = (2, 4)  # pytest's exit codes for an interrupted collection and a usage error


def pytest_outcome(path: Path, timeout_s: float = 300) -> dict[str, Any]:
    """Run one test file with pytest; its exit status and summary line, or why it did not run."""
    if not path.is_file():
        return {"outcome": f"not run: {path} absent (not a source checkout)"}
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(path)]
    began = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              cwd=path.parents[1], check=False)
    except subprocess.TimeoutExpired:
        return {"outcome": f"not finished: still running after {timeout_s:.0f} s"}
    seconds = round(time.perf_counter() - began, 1)
    output = done.stdout + done.stderr
    missing = MISSING_MODULE.search(output)
    if done.returncode in NO_TESTS_RAN and missing:
        return {"returncode": done.returncode, "seconds": seconds,
                "outcome": f"not run: {missing.group(1)} not installed"}
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return {"returncode": done.returncode, "seconds": seconds,
            "outcome": lines[-1] if lines else done.stderr[-300:]}
