"""What the tiny family's stages share: where the models are, engine settings, the torch thread.

Stage settings (a profile's per-stage dict) hold an optional "engine" dict that overrides the
family's engine defaults (the CPU recipe of PLATFORM.md); everything else is stage-specific.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import torch

from pipeline.engines.vllm import EngineSettings
from pipeline.stage import StageContext

T = TypeVar("T")

FAMILY_DIR = "tiny"
POOL_TIMEOUT_S = 5.0  # how long a stage waits for a free pool block before failing the job
ENGINE_DEFAULTS: dict[str, Any] = {
    "dtype": "float32",
    "max_model_len": 1024,
    "kv_cache_memory_bytes": 256 * 2**20,
    "enforce_eager": True,
    "enable_prompt_embeds": True,
    "max_num_seqs": 64,
}


def part_dir(ctx: StageContext, part: str) -> Path:
    """The built model directory of one part (thinker, talker, voicebox); clear error if absent."""
    directory = Path(ctx.models_dir) / FAMILY_DIR / part
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"tiny family not built at {directory.parent}: run "
            f"pipeline.families.tiny.build_tiny({ctx.models_dir!r}) first")
    return directory


def engine_settings(ctx: StageContext, part: str, **defaults: Any) -> EngineSettings:
    """Family defaults, then the stage's own defaults, then the profile's "engine" overrides."""
    merged = {**ENGINE_DEFAULTS, **defaults, **ctx.settings.get("engine", {})}
    merged["model"] = str(part_dir(ctx, part))
    return EngineSettings.from_mapping(merged)


def pool_timeout(ctx: StageContext) -> float:
    return float(ctx.settings.get("pool_timeout_s", POOL_TIMEOUT_S))


class TorchThread:
    """One thread for a stage's torch work, so the event loop never runs a tensor op.

    One thread, and torch itself on one thread: small ops are far faster single-threaded on
    these machines, and one thread keeps the stage's results reproducible.
    """

    def __init__(self, name: str) -> None:
        torch.set_num_threads(1)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-torch")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
