"""`GET /v1/models` and `GET /v1/models/{id}` in OpenAI's list and retrieve shapes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from agent.api.served_models import not_served, readiness_of, resolve, served_models

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    """Every served model version: its default flag, build (family, checksum, engine range),
    serving state, calls and stages' state; and the rollout in progress (or the last one)."""
    app = request.app
    rollout = app.state.rollouts.state
    return {"object": "list",
            "data": [model.describe(readiness_of(app, model)) for model in served_models(app)],
            "rollout": None if rollout is None else rollout.describe()}


@router.get("/v1/models/{model_id}", response_model=None)
async def retrieve_model(model_id: str, request: Request) -> dict[str, Any] | JSONResponse:
    """One version (`name@version`), or a name's default version (`name`); else 404 naming the
    versions served."""
    model = resolve(request.app, model_id)
    if model is None:
        return not_served(request.app, model_id)
    return model.describe(readiness_of(request.app, model))
