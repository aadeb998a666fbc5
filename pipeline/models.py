"""Making sure a family's models are built before its workers start (built locally if not).

The family's own `build` decides: it keeps a build whose manifest still matches and rebuilds a
missing or stale one (a new recipe). It runs in a spawned child process: it imports torch and
writes weights, neither of which belongs in the API process or on its event loop. Its progress
bar goes to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from pathlib import Path

logger = logging.getLogger(__name__)


def build_family(family: str, models_dir: str) -> None:
    """Run the family's build (idempotent). Child-process entry point."""
    from pipeline.families import load_family

    logging.basicConfig(level=logging.INFO)
    load_family(family).build(Path(models_dir), progress=True)


async def ensure_models(family: str, models_dir: Path) -> None:
    """Build the family's models unless already built; test families (dotted modules) have
    nothing to build."""
    if "." in family:
        return
    process = multiprocessing.get_context("spawn").Process(
        target=build_family, args=(family, str(models_dir)), name=f"omnivox-build-{family}")
    process.start()
    await asyncio.to_thread(process.join)
    if process.exitcode != 0:
        raise RuntimeError(f"building the {family!r} models under {models_dir} failed "
                           f"(exit code {process.exitcode}; its traceback is above)")
