"""What a running server says of its versions: GET /v1/version and /readyz carry omnivox's,
vLLM's and torch's versions and the served model version's build; the `openai` SDK retrieves a
pinned version and gets a 404 naming the served versions for one that is not served."""

from __future__ import annotations

import importlib.metadata as metadata
from pathlib import Path

import httpx
import openai
import pytest

from pipeline.engine_range import running_engines
from pipeline.families.kit.build_support import read_manifest
from tests.openai_clients import clients
from tests.served import Served


async def test_version_route_and_readyz_name_every_version(
    tiny_server: Served, tiny_models_dir: Path
) -> None:
    manifest = read_manifest(tiny_models_dir / "tiny")
    async with httpx.AsyncClient(base_url=tiny_server.url) as http:
        version, ready = (await http.get("/v1/version")).json(), (await http.get("/readyz")).json()
    engines = running_engines()
    assert version == {
        "object": "version", "omnivox": metadata.version("omnivox"),
        "vllm": engines["vllm"], "torch": engines["torch"],
        "models": [{"id": "tiny@1", "name": "tiny", "version": "1", "default": True,
                    "family": "tiny", "directory": str(tiny_models_dir / "tiny"),
                    "checksum": manifest["checksum"], "engines": manifest["engines"]}],
    }
    assert ready["versions"] == {k: v for k, v in version.items() if k != "object"}


async def test_sdk_retrieves_a_pinned_version_and_not_an_unserved_one(
    tiny_server: Served, tiny_models_dir: Path
) -> None:
    _, client = clients(tiny_server)
    pinned, unpinned = await client.models.retrieve("tiny@1"), await client.models.retrieve("tiny")
    assert pinned.id == unpinned.id == "tiny@1"
    extra = pinned.model_extra or {}
    assert extra["checksum"] == read_manifest(tiny_models_dir / "tiny")["checksum"]
    assert set(extra["engines"]) == {"vllm", "torch"}
    with pytest.raises(openai.NotFoundError) as missing:
        await client.models.retrieve("tiny@2")
    body = missing.value.body
    assert isinstance(body, dict) and body["code"] == "model_not_found"
    assert "tiny@2" in body["message"] and "served are: tiny@1" in body["message"]
