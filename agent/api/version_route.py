"""`GET /v1/version`: what runs here, omnivox, vLLM and torch, and each served model version with
its family, checksum and engine range; /readyz carries the same block."""

from __future__ import annotations

import functools
import importlib.metadata as metadata
from typing import Any

from fastapi import APIRouter, FastAPI, Request

from agent.api.served_models import served_models
from pipeline.engine_range import running_engines

router = APIRouter()
PROJECT = "omnivox"


def versions(app: FastAPI) -> dict[str, Any]:
    """The versions block: omnivox's, the running engines' (null when one is not installed),
    and every served model version's build."""
    engines = running_engines()
    return {"omnivox": _installed(PROJECT), "vllm": engines.get("vllm"),
            "torch": engines.get("torch"), "models": [m.build() for m in served_models(app)]}


@router.get("/v1/version")
async def version(request: Request) -> dict[str, Any]:
    """The versions block of this server (API keys as every /v1 route)."""
    return {"object": "version", **versions(request.app)}


@functools.cache  # metadata scans take ms: read once, on the event loop
def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
