"""The admin routes of model rollout (API keys, as every /v1 route): `POST /v1/models/rollout`
starts one (agent/serving/rollout.py), `GET /v1/models/rollout` says how it goes (or how the
last one ended), `POST /v1/models/{id}/retire` takes a version out of service."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from agent.api.request_body import read_request
from agent.openai_errors import openai_error
from agent.serving.rollout import RolloutRefused, Rollouts
from agent.serving.rollout_state import Strategy

router = APIRouter()
MAX_BODY_BYTES = 4096


class RolloutRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="NAME@VERSION to roll out")
    strategy: Strategy = Strategy.RED_BLACK
    steps: list[int] | None = Field(None, description="red-black: shares of new callers, %")
    canary_turns: int = 1
    wait: bool = Field(False, description="answer once the rollout is over, not at once")


class RetireRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    force: bool = False  # retire even with calls pinned to it (they move to the default)


def _refusal(exc: RolloutRefused) -> JSONResponse:
    return openai_error(exc.status, exc.code, exc.message, param="model")


@router.post("/v1/models/rollout", response_model=None)
async def start_rollout(request: Request) -> dict[str, Any] | JSONResponse:
    """Start a rollout (202 with its state), or with `wait`, its state once over (200)."""
    asked = await read_request(request, RolloutRequest, MAX_BODY_BYTES)
    if isinstance(asked, JSONResponse):
        return asked
    rollouts: Rollouts = request.app.state.rollouts
    try:
        state = rollouts.begin(asked.model, asked.strategy, asked.steps, asked.canary_turns)
    except RolloutRefused as exc:
        return _refusal(exc)
    if not asked.wait:
        return JSONResponse({"object": "model.rollout", **state.describe()}, status_code=202)
    await rollouts.wait()
    return {"object": "model.rollout", **state.describe()}


@router.get("/v1/models/rollout", response_model=None)
async def rollout_state(request: Request) -> dict[str, Any] | JSONResponse:
    """The rollout in progress, or the last one; 404 when there has been none."""
    state = request.app.state.rollouts.state
    if state is None:
        return openai_error(404, "no_rollout", "no rollout has run on this server")
    return {"object": "model.rollout", **state.describe()}


@router.post("/v1/models/{model_id}/retire", response_model=None)
async def retire(model_id: str, request: Request) -> dict[str, Any] | JSONResponse:
    """Stop serving a version that is not its name's default (409 while calls are pinned to
    it, unless `force`)."""
    asked = await read_request(request, RetireRequest, MAX_BODY_BYTES)
    if isinstance(asked, JSONResponse):
        return asked
    rollouts: Rollouts = request.app.state.rollouts
    try:
        return await rollouts.retire(model_id, asked.force)
    except RolloutRefused as exc:
        return _refusal(exc)
