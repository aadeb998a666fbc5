"""GPU memory per stage of a running pipeline, probed from outside its workers.

`nvidia-smi` lists the memory each process holds on the GPU; a stage's figure is the sum over
its worker and the worker's descendants (its vLLM engine core). This is what the processes
hold (CUDA context, weights, the KV cache vLLM reserves, PyTorch's cache), not
torch.cuda.max_memory_allocated: the probe needs nothing from the workers.
"""

from __future__ import annotations

import subprocess
from typing import Any

import psutil

QUERY = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def process_gpu_memory() -> dict[int, int]:
    """MiB each process holds on the GPUs, by pid (empty when nvidia-smi cannot say)."""
    try:
        out = subprocess.run(QUERY, capture_output=True, text=True, timeout=30,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    memory: dict[int, int] = {}
    for line in out.splitlines():
        pid, _, used = line.partition(",")
        if pid.strip().isdigit() and used.strip().isdigit():
            memory[int(pid)] = memory.get(int(pid), 0) + int(used)
    return memory


def stage_gpu_memory(pipe: Any) -> dict[str, int]:
    """MiB per stage of the pipeline `pipe` (its worker and their descendants)."""
    held = process_gpu_memory()
    figures: dict[str, int] = {}
    for stage, status in pipe.health().stages.items():
        if status.pid is None:
            continue
        figures[stage] = sum(held.get(pid, 0) for pid in _tree(status.pid))
    return figures


def _tree(pid: int) -> list[int]:
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []
