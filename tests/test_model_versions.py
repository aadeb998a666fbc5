"""Model versions on disk: a build records its checksum and engine range, a second version is
built beside the first, and a version whose files changed or whose engine range excludes the
running vLLM is refused before it is loaded (by the server, and by `omnivox serve` in one line).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from packaging.specifiers import SpecifierSet

from agent.app import create_app
from agent.cli import CommandLineError, build_models, parse_args, settings_of
from agent.config import Settings
from agent.profiles import build_pipeline
from pipeline.engine_range import running_engines
from pipeline.families.kit.build_support import files_checksum, read_manifest
from pipeline.model_version import ModelVersion
from pipeline.models import ensure_models
from pipeline.version_checks import (
    OUTPUT_SCHEMA,
    ModelVersionError,
    declared_output_schema,
    verify_version,
)
from tests.served import serve

THINKER_WEIGHTS = "thinker/model.safetensors"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models dir holding tiny@1 and tiny@2 (seed 8), built by the command line."""
    models = tmp_path_factory.mktemp("versions")
    _build(models)
    _build(models, "--version", "2", "--seed", "8")
    return models


def _build(models: Path, *flags: str) -> None:
    """`omnivox models build tiny FLAGS` (its command, without main's process-wide logging)."""
    args = parse_args(["models", "build", "tiny", "--models-dir", str(models), *flags])
    assert build_models(args, settings_of(args)) == 0


def test_a_build_records_the_sha256_of_its_files_and_its_engine_range(models: Path) -> None:
    family = models / "tiny"
    manifest = read_manifest(family)
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((family / name).read_bytes()).hexdigest() == digest, name
    assert THINKER_WEIGHTS in manifest["files"]
    assert manifest["checksum"] == files_checksum(manifest["files"])
    running = running_engines()
    assert set(manifest["engines"]) == {"vllm", "torch"}
    for engine, specifier in manifest["engines"].items():
        assert SpecifierSet(specifier).contains(running[engine], prereleases=True), specifier
        assert specifier.startswith(">=") and ",<" in specifier  # a range, not one version


def test_a_second_version_is_built_beside_the_first_from_its_own_seed(models: Path) -> None:
    first, second = read_manifest(models / "tiny"), read_manifest(models / "versions/2/tiny")
    assert (first["seed"], second["seed"]) == (1234, 8)
    assert first["checksum"] != second["checksum"]
    assert (models / "tiny" / THINKER_WEIGHTS).read_bytes() != (
        models / "versions/2/tiny" / THINKER_WEIGHTS).read_bytes()
    # Built again, a version keeps its seed; another seed would change its weights: refused.
    _build(models, "--version", "2")
    assert read_manifest(models / "versions/2/tiny")["checksum"] == second["checksum"]
    with pytest.raises(CommandLineError, match="built from seed 8"):
        _build(models, "--version", "2", "--seed", "9")


def test_a_version_declares_its_output_schema_in_its_manifest(models: Path,
                                                               tmp_path: Path) -> None:
    version = _copy_version(models, "2", tmp_path)
    root = version.root
    schema = {"type": "object", "properties": {"mood": {"enum": ["calm", "sad"]}}}
    declared = tmp_path / "mood.json"
    declared.write_text(json.dumps(schema))
    _build(tmp_path, "--version", "2", "--output-schema", str(declared))
    assert declared_output_schema(version, "tiny") == schema
    assert verify_version("tiny", version) is not None  # its files are still the ones built
    _build(tmp_path, "--version", "2")  # built again without the flag: it keeps it
    assert read_manifest(root / "tiny")[OUTPUT_SCHEMA] == schema
    for text, refusal in [("{", "not a readable JSON file"), ('{"type": 3}', "not a JSON schema"),
                          ('{"properties": {"a": {"maxLength": 4}}}', "properties.a.maxLength")]:
        declared.write_text(text)
        with pytest.raises(CommandLineError, match=refusal):
            _build(tmp_path, "--version", "2", "--output-schema", str(declared))
    assert declared_output_schema(version, "tiny") == schema  # a refused one changes nothing


async def test_a_changed_weight_file_is_refused_naming_the_file(
    models: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    version = _copy_version(models, "2", tmp_path)
    weights = version.root / "tiny" / THINKER_WEIGHTS
    changed = bytearray(weights.read_bytes())
    changed[-1] ^= 1
    weights.write_bytes(bytes(changed))
    with caplog.at_level(logging.ERROR), pytest.raises(ModelVersionError) as refused:
        await ensure_models("tiny", version)
    assert THINKER_WEIGHTS in str(refused.value) and "--version 2 --seed 8" in str(refused.value)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and THINKER_WEIGHTS in errors[0]
    assert weights.read_bytes() == bytes(changed), "a refused version is never rebuilt silently"


async def test_an_engine_range_excluding_the_running_vllm_is_refused(
    models: Path, tmp_path: Path
) -> None:
    version = _copy_version(models, "2", tmp_path)
    vllm = running_engines()["vllm"]
    _set_engines(version.root / "tiny", {"vllm": ">=99.0,<99.1"})
    with pytest.raises(ModelVersionError) as refused:
        await ensure_models("tiny", version)
    assert f"vllm {vllm}" in str(refused.value) and "vllm>=99.0,<99.1" in str(refused.value)
    # `omnivox serve` says so in one line and exits 2, before it starts anything.
    served = subprocess.run(
        [sys.executable, "-m", "agent.cli", "serve", "--profile", "tiny", "--models-dir",
         str(tmp_path), "--model-version", "2", "--port", "1"],
        capture_output=True, text=True, timeout=120, check=False)
    assert served.returncode == 2, served.stderr
    lines = served.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in served.stderr, served.stderr
    assert f"vllm {vllm}" in lines[0] and "vllm>=99.0,<99.1" in lines[0]


async def test_a_build_older_than_engine_ranges_is_rebuilt_on_load(
    models: Path, tmp_path: Path
) -> None:
    version = _copy_version(models, "1", tmp_path)
    before = read_manifest(version.root / "tiny")
    _set_engines(version.root / "tiny", None)
    await ensure_models("tiny", version)
    after = read_manifest(version.root / "tiny")
    assert after["engines"] == before["engines"] and after["checksum"] == before["checksum"]


def _copy_version(models: Path, number: str, to: Path) -> ModelVersion:
    """A copy of one built version (a version of the models dir `to`), for a test to damage."""
    copy = ModelVersion(to, number)
    shutil.copytree(ModelVersion(models, number).root / "tiny", copy.root / "tiny")
    return copy


def _set_engines(family: Path, engines: dict[str, str] | None) -> None:
    """Rewrite the manifest's engine range (None: as a build from before ranges had it)."""
    manifest = read_manifest(family)
    manifest.pop("engines")
    if engines is not None:
        manifest["engines"] = engines
    (family / "manifest.json").write_text(json.dumps(manifest))


async def test_a_server_refusing_its_version_says_why_at_readyz(
    models: Path, tmp_path: Path
) -> None:
    version = _copy_version(models, "2", tmp_path)
    (version.root / "tiny" / THINKER_WEIGHTS).write_bytes(b"not the weights")
    settings = Settings(profile="tiny", models_dir=tmp_path, model_version="2",
                        data_dir=tmp_path / "data")
    async with serve(create_app(settings, pipeline=build_pipeline(settings))) as served, \
            httpx.AsyncClient(base_url=served.url) as http:
        for _ in range(100):  # refused before any worker starts
            ready = await http.get("/readyz")
            if ready.json()["stages"].get("pipeline", {}).get("state") == "failed":
                break
            await asyncio.sleep(0.1)
    assert ready.status_code == 503
    assert THINKER_WEIGHTS in ready.json()["stages"]["pipeline"]["reason"]
    assert [m["id"] for m in ready.json()["versions"]["models"]] == ["tiny@2"]
