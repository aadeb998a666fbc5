"""The versions a call worker serves: views of the front's pipelines (pipeline/turns/orchestrator.py
`Pipeline.attach`), one per served version, never engines of its own. The front tells each
worker what it serves now (agent/calls/workers.py `versions_of`); rollouts, drains and retires
stay with the front, a worker only follows: new versions attached, the default moved, a
version the front stopped serving dropped for new calls (a live call keeps its binding)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from agent.serving.registry import ModelRegistry, ServedVersion
from pipeline.model_version import ModelVersion
from pipeline.turns.orchestrator import Pipeline, PipelineAddress

log = logging.getLogger(__name__)


async def follow(models: ModelRegistry, served: list[dict[str, Any]], owner: int) -> None:
    """Make `models` serve what the front's list `served` says (each entry: name, version,
    family, models directory, default, the share of new callers a red-black shift sends it,
    address); pool blocks held here carry `owner`."""
    wanted = {f"{entry['name']}@{entry['version']}": entry for entry in served}
    for model_id in [v.id for v in models.versions() if v.id not in wanted]:
        models.remove(model_id)
    for model_id, entry in wanted.items():
        address = PipelineAddress(**entry["address"])
        current = models.get(model_id)
        if current is None or current.pipeline.pool.name != address.pool_name:
            pipeline = await Pipeline.attach(address, owner)
            log.info("attached to %s (pool %s)", model_id, address.pool_name)
            model = ModelVersion(Path(entry["models_dir"]), entry["version"])
            current = ServedVersion(entry["name"], model, entry["family"], pipeline, owned=True)
            models.add(current)
        if entry["default"]:
            models.set_default(current)
    follow_splits(models, served)


def follow_splits(models: ModelRegistry, served: list[dict[str, Any]]) -> None:
    """The front's red-black shifts: each name's new callers split here as there."""
    for name in {entry["name"] for entry in served}:
        shifted = [e for e in served if e["name"] == name and e.get("shifted_percent", 0) > 0]
        models.split(name, shifted[0]["version"] if shifted else None,
                     shifted[0]["shifted_percent"] if shifted else 0)


async def detach_all(models: ModelRegistry) -> None:
    """Close every view (the worker stops; the front's pipelines go on)."""
    for served in models.versions():
        await served.pipeline.stop()
