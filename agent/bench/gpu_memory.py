"""GPU memory per stage of a running pipeline, sampled while turns run (`MemoryWatch`).

Two figures per stage, each the peak of the samples: `process_mib`, what `nvidia-smi` says
the stage's worker and its descendants (its vLLM engine core) hold on the GPU (CUDA context,
weights, the KV cache vLLM reserves, PyTorch's cache); and `torch_allocated_mib`, what the
worker's own live CUDA tensors hold (torch.cuda.memory_allocated, from the stage's existing
Inspect reply: the Thinker's hidden-state model, SNAC), which excludes the engine core's.
`device_used_mib` is the whole device's, for containers that hide process ids from nvidia-smi.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from typing import Any

import psutil

QUERY = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
DEVICE_QUERY = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]


def _query(command: list[str]) -> list[str]:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30,
                              check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return []


def device_used_mib() -> int | None:
    """MiB in use on the first GPU, all processes together (None when nvidia-smi cannot say):
    the figure left when a container hides the processes' ids from nvidia-smi."""
    lines = [line.strip() for line in _query(DEVICE_QUERY)]
    return int(lines[0]) if lines and lines[0].isdigit() else None


def process_gpu_memory() -> dict[int, int]:
    """MiB each process holds on the GPUs, by pid (empty when nvidia-smi cannot say)."""
    memory: dict[int, int] = {}
    for line in _query(QUERY):
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


class MemoryWatch:
    """Samples a pipeline's memory figures every `interval_s` while in use; keeps the peaks."""

    def __init__(self, pipe: Any, interval_s: float = 0.5) -> None:
        self.pipe, self.interval_s = pipe, interval_s
        self.process: dict[str, int] = {}
        self.torch: dict[str, int] = {}
        self.device = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> MemoryWatch:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.sample()  # one at the end, so a short level is not left unsampled

    def figures(self) -> dict[str, Any]:
        """The peaks, in MiB."""
        return {"process_mib": self.process, "torch_allocated_mib": self.torch,
                "device_used_mib": self.device}

    async def sample(self) -> None:
        """One sample of every figure."""
        self.process = _peak(self.process, await asyncio.to_thread(stage_gpu_memory, self.pipe))
        replies = await self.pipe.active_requests()
        self.torch = _peak(self.torch, {stage: reply.cuda_allocated_bytes // 2**20
                                        for stage, reply in replies.items()})
        used = await asyncio.to_thread(device_used_mib)
        self.device = max(self.device, used or 0)

    async def _run(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self.interval_s)


def _peak(before: dict[str, int], now: dict[str, int]) -> dict[str, int]:
    return {stage: max(before.get(stage, 0), now.get(stage, 0)) for stage in {*before, *now}}
