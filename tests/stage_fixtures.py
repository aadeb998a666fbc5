"""Fixture factories for the family tests: a block pool and stages started in the test process.

A test module makes its fixtures with them, e.g. `pool = pool_fixture("omnivox-tiny-test", 64,
1 << 20)` and `thinker = stage_fixture(TinyThinker, {...}, "tiny-bench")`. Stages start once per
module (engines take seconds) from the module's `family_models` fixture (the models directory
with the family built), on its `pool`; each start time is printed as a figure.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.stage import Stage, StageContext
from pipeline.tensors.shm import BlockPool


def print_figure(tag: str, name: str, value: float, unit: str) -> None:
    """Print a benchmark figure as `[tag] name: value unit` (figures are printed, not asserted)."""
    print(f"\n[{tag}] {name}: {value:.3f} {unit}")


def pool_fixture(prefix: str, block_count: int, block_size: int) -> Callable[..., Any]:
    """A module-scoped fixture: a new block pool named after `prefix` and this process."""

    @pytest.fixture(scope="module")
    def pool() -> Iterator[BlockPool]:
        pool = BlockPool.create(f"{prefix}-{os.getpid()}", block_count=block_count,
                                block_size=block_size)
        yield pool
        pool.close()
        pool.unlink()

    return pool


def stage_fixture(stage_class: type[Stage], settings: dict[str, Any],
                  tag: str) -> Callable[..., Any]:
    """A module-scoped fixture: a `stage_class` started with these settings, stopped after."""

    @pytest.fixture(scope="module")
    async def stage(pool: BlockPool, family_models: Path) -> AsyncIterator[Stage]:
        started = stage_class()
        began = time.perf_counter()
        await started.start(StageContext(pool, dict(settings), str(family_models)))
        print_figure(tag, f"{started.name} start", time.perf_counter() - began, "s")
        yield started
        await started.stop()

    return stage
