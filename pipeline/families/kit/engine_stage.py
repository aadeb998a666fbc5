"""A stage whose requests all live in one vLLM engine, beside a torch thread; the engine
defaults the families start from.

A stage's settings (a profile's per-stage dict) hold an optional "engine" dict that overrides
a family's engine defaults; `ENGINE_DEFAULTS` (float32, eager, a fixed KV cache, which suit a
CPU) is where the tiny, qwen25_omni, qwen3_omni and orpheus families start theirs
(`engine_settings`: the defaults, then the overrides, for one model directory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.engines.vllm import EngineSettings, VllmEngine
from pipeline.families.kit.torch_thread import TorchThread
from pipeline.stage import JobT, OutputT, Stage, StageContext

ENGINE_DEFAULTS: dict[str, Any] = {
    "dtype": "float32",
    "max_model_len": 1024,
    "kv_cache_memory_bytes": 256 * 2**20,
    "enforce_eager": True,
    "enable_prompt_embeds": True,
    "max_num_seqs": 64,
}


class EngineStage(Stage[JobT, OutputT]):
    """A stage whose requests all live in one vLLM engine, with a torch thread.

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


def engine_settings(ctx: StageContext, model: Path) -> EngineSettings:
    """The engine of `model`: the CPU-friendly defaults, then the stage's "engine" overrides."""
    merged = {**ENGINE_DEFAULTS, **ctx.settings.get("engine", {}), "model": str(model)}
    return EngineSettings.from_mapping(merged)
