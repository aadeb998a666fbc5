"""The models this server serves, as clients name them: `name@version`.

A model's name is the profile the server runs (`tiny`, `local`); the server starts with one
version of it, the `model_version` setting (1 unless chosen), its default; a rollout adds others
beside it (agent/serving: each version its own pipeline) and moves the default. An unpinned
`tiny` means the default (or, during a red-black shift, the version the shift sends it to),
`tiny@2` names a version, any other version is not served. Each version is its family, its
checkpoint's checksum and the engine range it was built for (its manifest:
pipeline.version_checks), its state (serving, draining...) and its stages' state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from agent.calls.readiness import Readiness
from agent.openai_errors import openai_error
from agent.serving.binding import unknown_model
from agent.serving.registry import ModelRegistry, ServedVersion
from pipeline.engine_range import ENGINES
from pipeline.families import recognises_speech
from pipeline.families.kit.build_support import MANIFEST
from pipeline.version_checks import built_manifest

OWNER = "omnivox"


@dataclass(frozen=True)
class ServedModel:
    """One version of one model as clients see it: its served version, and whether it is the
    default of its name."""

    served: ServedVersion
    default: bool  # what an unpinned request for `name` gets (outside a shift)

    @property
    def id(self) -> str:
        return self.served.id

    @property
    def pipeline(self) -> Any:
        return self.served.pipeline

    def created(self) -> int:
        """When its checkpoint was built (unix seconds; 0 while it is not built yet)."""
        try:
            return int((self.served.root / self.served.family / MANIFEST).stat().st_mtime)
        except OSError:
            return 0

    @property
    def recognises_speech(self) -> bool:
        """Whether its family writes what a speaker said (transcriptions)."""
        return recognises_speech(self.served.family)

    def build(self) -> dict[str, Any]:
        """Its family, checkpoint directory, checksum and engine range (null while not built)."""
        s = self.served
        manifest = built_manifest(s.model, s.family) or {}
        return {"id": self.id, "name": s.name, "version": s.version,
                "default": self.default, "family": s.family,
                "directory": str(s.root / s.family), "checksum": manifest.get("checksum"),
                "engines": manifest.get(ENGINES)}

    def describe(self, readiness: Readiness) -> dict[str, Any]:
        """OpenAI's model object, with the version, whether it is the default, its build, its
        serving state, the calls on it and its stages' state (`readiness`: its pipeline's)."""
        return {**self.build(), "object": "model", "created": self.created(), "owned_by": OWNER,
                "state": str(self.served.state), "calls": self.served.calls,
                "ready": readiness.stages_ready(), "stages": readiness.stages()}


def registry(app: FastAPI) -> ModelRegistry:
    models: ModelRegistry = app.state.models
    return models


def served_models(app: FastAPI) -> list[ServedModel]:
    """Every model version the app serves (none on a media-only server)."""
    models = registry(app)
    return [ServedModel(v, models.is_default(v)) for v in models.versions()]


def served_version(settings: Any, pipeline: Any, owned: bool) -> ServedVersion | None:
    """The version the app starts with: its profile's pipeline, once it has a model family;
    `owned`: the app's own (a red-black rollout from it stops its workers)."""
    family = getattr(getattr(pipeline, "settings", None), "family", None)
    if family is None:  # a media-only server (or a test's stand-in) answers with no models
        return None
    return ServedVersion(settings.profile, pipeline.settings.version, family, pipeline,
                         owned=owned)


def readiness_of(app: FastAPI, model: ServedModel) -> Readiness:
    """The readiness of a version's stages: its pipeline's, with why its start gave up for the
    version the app started with (the app heard it; that version may no longer be the
    default, whose stages the app's own readiness follows)."""
    readiness = Readiness(model.pipeline)
    if model.pipeline is app.state.pipeline and app.state.readiness.failed_start:
        readiness.start_failed(app.state.readiness.failed_start)
    return readiness


def resolve(app: FastAPI, model_id: str) -> ServedModel | None:
    """The version `model_id` names: `name@version` exactly, or `name`'s default (or where a
    red-black shift sends this request)."""
    models = registry(app)
    served = models.resolve(model_id)
    return None if served is None else ServedModel(served, models.is_default(served))


def not_served(app: FastAPI, model_id: str) -> JSONResponse:
    """404 `model_not_found` for an id this server does not serve, naming the versions it does."""
    return openai_error(404, "model_not_found", str(unknown_model(registry(app), model_id)),
                        param="model")
