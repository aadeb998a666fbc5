"""The models this server serves, as clients name them: `name@version`.

A model's name is the profile the server runs (`tiny`, `local`); today a profile has one
version, `1`, which is therefore its default: an unpinned `tiny` means `tiny@1`. Each model's
state is its stages' state from readiness (/readyz).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from agent.ops.readiness import Readiness
from pipeline.families import load_family

FIRST_VERSION = "1"
OWNER = "omnivox"
MANIFEST = "manifest.json"  # written last by a family's build: when the checkpoint was made


@dataclass(frozen=True)
class ServedModel:
    """One version of one model: its profile name, version and model family."""

    name: str
    version: str
    family: str
    default: bool  # what an unpinned request for `name` gets
    models_dir: Path

    @property
    def id(self) -> str:
        return f"{self.name}@{self.version}"

    def created(self) -> int:
        """When its checkpoint was built (unix seconds; 0 while it is not built yet)."""
        try:
            return int((self.models_dir / self.family / MANIFEST).stat().st_mtime)
        except OSError:
            return 0

    @property
    def recognises_speech(self) -> bool:
        """Whether its family writes what a speaker said (transcriptions)."""
        return bool(getattr(load_family(self.family), "RECOGNISES_SPEECH", False))

    def describe(self, readiness: Readiness) -> dict[str, Any]:
        """OpenAI's model object, with the version, whether it is the default and its
        stages' state added."""
        stages = readiness.stages()
        return {"id": self.id, "object": "model", "created": self.created(), "owned_by": OWNER,
                "name": self.name, "version": self.version, "default": self.default,
                "family": self.family, "ready": readiness.stages_ready(), "stages": stages}


def served_models(app: FastAPI) -> list[ServedModel]:
    """Every model version the app serves: its profile's, once it has a model pipeline."""
    family = getattr(getattr(app.state.pipeline, "settings", None), "family", None)
    if family is None:  # a media-only server answers calls with no models
        return []
    settings = app.state.settings
    return [ServedModel(settings.profile, FIRST_VERSION, family, True, Path(settings.models_dir))]


def resolve(app: FastAPI, model_id: str) -> ServedModel | None:
    """The version `model_id` names: `name@version` exactly, or `name`'s default."""
    name, pinned, version = model_id.partition("@")
    for model in served_models(app):
        if model.name == name and (model.version == version if pinned else model.default):
            return model
    return None
