"""The build steps the families share: skip a current build, rebuild a damaged one, and never
leave a half-written family behind when a build fails."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.families.kit.build_support import (
    build_once,
    manifest_matches,
    read_manifest,
    write_manifest,
)

RECIPE = {"family": "toy", "recipe": "toy-1"}


def _write_toy(root: Path) -> None:
    (root / "part").mkdir(parents=True)
    (root / "part" / "weights.bin").write_bytes(b"\x01\x02\x03")
    write_manifest(root, RECIPE)


def _build(models: Path, write: Callable[[Path], None] = _write_toy) -> Path:
    return build_once(models, "toy", lambda target: manifest_matches(target, RECIPE), write)


def test_a_current_build_is_kept_and_a_damaged_one_rebuilt(tmp_path: Path) -> None:
    family = _build(tmp_path)
    manifest = read_manifest(family)
    assert manifest["recipe"] == "toy-1" and list(manifest["files"]) == ["part/weights.bin"]
    stamp = (family / "manifest.json").stat().st_mtime_ns
    assert _build(tmp_path) == family
    assert (family / "manifest.json").stat().st_mtime_ns == stamp, "a current build is kept"

    (family / "part" / "weights.bin").write_bytes(b"damaged")
    assert not manifest_matches(family, RECIPE)
    _build(tmp_path)
    assert (family / "part" / "weights.bin").read_bytes() == b"\x01\x02\x03"
    assert not manifest_matches(family, {**RECIPE, "recipe": "toy-2"})


def test_a_failed_build_leaves_the_old_one_and_no_staging(tmp_path: Path) -> None:
    family = _build(tmp_path)
    (family / "part" / "weights.bin").write_bytes(b"damaged")

    def broken(root: Path) -> None:
        (root / "part").mkdir(parents=True)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _build(tmp_path, broken)
    assert (family / "part" / "weights.bin").read_bytes() == b"damaged", "old build untouched"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".toy.lock", "toy"]
