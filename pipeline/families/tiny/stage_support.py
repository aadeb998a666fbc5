"""What the tiny family's stages share: where the models are, engines, the torch thread.

Stage settings (a profile's per-stage dict) hold an optional "engine" dict that overrides the
family's engine defaults (`ENGINE_DEFAULTS`: float32, eager, a fixed KV cache, which suit a CPU);
everything else is stage-specific.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pipeline.engines.vllm import EngineSettings, VllmEngine
from pipeline.families.work_thread import WorkThread
from pipeline.stage import JobT, OutputT, Stage, StageContext

FAMILY_DIR = "tiny"
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


class TorchThread(WorkThread):
    """A stage's work thread for torch, with torch itself on one thread too.

    Small ops are far faster single-threaded on these machines, and one thread keeps the
    stage's results reproducible.
    """

    def __init__(self, name: str) -> None:
        torch.set_num_threads(1)
        super().__init__(name, "torch")


class EngineStage(Stage[JobT, OutputT]):
    """A tiny-family stage whose requests all live in one vLLM engine, with a torch thread.

    Its requests are in the engine from the stream's first step on, so abort and the active
    request ids go to the engine alone. Subclasses set `engine` and `torch` in start().
    """

    engine: VllmEngine
    torch: TorchThread

    async def abort(self, request_ids: list[str]) -> None:
        await self.engine.abort(request_ids)

    def active_request_ids(self) -> list[str]:
        return self.engine.active_request_ids()

    def failure(self) -> str | None:
        return self.engine.failure()

    async def stop(self) -> None:
        await self.engine.stop()
        self.torch.close()
