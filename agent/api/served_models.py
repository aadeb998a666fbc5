"""The models this server serves, as clients name them: `name@version`.

A model's name is the profile the server runs (`tiny`, `local`); it serves one version of it,
the `model_version` setting (1 unless chosen), which is therefore its default: an unpinned
`tiny` means that version, `tiny@1` names it, any other version is not served. Each version is
its family, its checkpoint's checksum and the engine range it was built for (its manifest:
pipeline.model_versions), and its stages' state from readiness (/readyz).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from agent.api.openai_errors import openai_error
from agent.ops.readiness import Readiness
from pipeline.engine_range import ENGINES
from pipeline.families import load_family
from pipeline.families.build_support import MANIFEST
from pipeline.model_versions import built_manifest

OWNER = "omnivox"


@dataclass(frozen=True)
class ServedModel:
    """One version of one model: its profile name, version and model family."""

    name: str
    version: str
    family: str
    default: bool  # what an unpinned request for `name` gets
    root: Path  # the version's models directory (pipeline.model_versions.version_root)

    @property
    def id(self) -> str:
        return f"{self.name}@{self.version}"

    def created(self) -> int:
        """When its checkpoint was built (unix seconds; 0 while it is not built yet)."""
        try:
            return int((self.root / self.family / MANIFEST).stat().st_mtime)
        except OSError:
            return 0

    @property
    def recognises_speech(self) -> bool:
        """Whether its family writes what a speaker said (transcriptions)."""
        return bool(getattr(load_family(self.family), "RECOGNISES_SPEECH", False))

    def build(self) -> dict[str, Any]:
        """Its family, checkpoint directory, checksum and engine range (null while not built)."""
        manifest = built_manifest(self.root, self.family) or {}
        return {"id": self.id, "name": self.name, "version": self.version,
                "default": self.default, "family": self.family,
                "directory": str(self.root / self.family), "checksum": manifest.get("checksum"),
                "engines": manifest.get(ENGINES)}

    def describe(self, readiness: Readiness) -> dict[str, Any]:
        """OpenAI's model object, with the version, whether it is the default, its build and its
        stages' state added."""
        return {**self.build(), "object": "model", "created": self.created(), "owned_by": OWNER,
                "ready": readiness.stages_ready(), "stages": readiness.stages()}


def served_models(app: FastAPI) -> list[ServedModel]:
    """Every model version the app serves: its profile's, once it has a model pipeline."""
    family = getattr(getattr(app.state.pipeline, "settings", None), "family", None)
    if family is None:  # a media-only server answers calls with no models
        return []
    settings = app.state.settings  # the pipeline's models_dir is the served version's root
    return [ServedModel(settings.profile, settings.model_version, family, True,
                        Path(app.state.pipeline.settings.models_dir))]


def resolve(app: FastAPI, model_id: str) -> ServedModel | None:
    """The version `model_id` names: `name@version` exactly, or `name`'s default."""
    name, pinned, version = model_id.partition("@")
    for model in served_models(app):
        if model.name == name and (model.version == version if pinned else model.default):
            return model
    return None


def not_served(app: FastAPI, model_id: str) -> JSONResponse:
    """404 `model_not_found` for an id this server does not serve, naming the versions it does."""
    served = ", ".join(model.id for model in served_models(app)) or "none"
    return openai_error(404, "model_not_found", f"The model {model_id!r} is not served here; "
                        f"the versions served are: {served} (GET /v1/models)", param="model")
