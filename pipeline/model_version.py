"""A model version: its number and the models directory it belongs to, carried as one typed
value from the settings to the stages (never parsed back out of a path).

Version 1 of a family lives where builds have always put it, `<models_dir>/<family>/`; version
N > 1 lives in a models directory of its own (its root), `<models_dir>/versions/N/<family>/`,
so a stage serving it reads it exactly as it reads version 1. The checks made before a version
is loaded are in pipeline/version_checks.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FIRST_VERSION = "1"
VERSIONS_DIR = "versions"


@dataclass(frozen=True)
class ModelVersion:
    """One version of the models on disk: the models directory it belongs to and its number."""

    models_dir: Path
    number: str = FIRST_VERSION

    @property
    def root(self) -> Path:
        """The models directory the version's stages read (`models_dir` for version 1)."""
        base = Path(self.models_dir)
        return base if self.number == FIRST_VERSION else base / VERSIONS_DIR / self.number

    def __str__(self) -> str:
        return self.number
