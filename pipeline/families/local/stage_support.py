"""What the local family's stages share: where the built models are, and a work thread.

Stage settings (a profile's per-stage dict) are read with `setting`; the Thinker's optional
"engine" dict overrides the family's vLLM defaults.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from pipeline.families.local.build import FAMILY, MANIFEST, VOICE_DIR
from pipeline.families.local.packaged import VOICE_NAME
from pipeline.stage import StageContext

T = TypeVar("T")

POOL_TIMEOUT_S = 5.0  # how long a stage waits for a free pool block before failing the job


def family_dir(ctx: StageContext) -> Path:
    """The built family directory; a clear error when it has not been built."""
    directory = Path(ctx.models_dir) / FAMILY
    if not (directory / MANIFEST).is_file():
        raise FileNotFoundError(
            f"local family not built at {directory}: run "
            f"pipeline.families.local.build_local({ctx.models_dir!r}) (or `omnivox models "
            f"build local`) first")
    return directory


def voice_files(ctx: StageContext) -> tuple[Path, Path]:
    """The built Piper voice: (ONNX model, its JSON config)."""
    directory = family_dir(ctx) / VOICE_DIR
    return directory / f"{VOICE_NAME}.onnx", directory / f"{VOICE_NAME}.onnx.json"


def pool_timeout(ctx: StageContext) -> float:
    """Seconds a stage waits for a free pool block."""
    return float(ctx.settings.get("pool_timeout_s", POOL_TIMEOUT_S))


class WorkThread:
    """One thread for a stage's blocking work (a model's forward), so the loop never runs it.

    One thread: the machines have few cores and each model runs single-threaded; jobs of
    the stage run one after another in submission order.
    """

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-work")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` in the thread and await its result."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        """Stop taking work; queued calls are cancelled."""
        self._executor.shutdown(wait=False, cancel_futures=True)
