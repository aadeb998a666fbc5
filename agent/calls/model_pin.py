"""Which model version a new call talks to: the `model` its session names (the offer's
`session`, or the WebSocket's `?model=`) pins it, else its name's default at that moment
(agent/serving/binding.py). A model not served is refused before the call exists."""

from __future__ import annotations

import functools
from typing import Any

from fastapi import FastAPI

from agent.realtime.aliases import model_alias
from agent.serving.binding import UnknownModelError, unknown_model
from agent.serving.registry import ModelRegistry


def pinned_factory(app: FastAPI, model_id: str | None) -> Any:
    """The app's handler factory for a call pinned to `model_id` (None, or one of OpenAI's
    Realtime model names: unpinned, the factory as it is); UnknownModelError when that model
    is not served."""
    factory = app.state.handler_factory
    if model_id is None:
        return factory
    models: ModelRegistry = app.state.models
    if models.resolve(model_id) is None:
        if model_alias(app.state.settings.aliases, model_id):  # OpenAI's name: the default
            return factory
        raise unknown_model(models, model_id)
    return functools.partial(factory, model_id=model_id)


def websocket_model(app: FastAPI, asked: str | None) -> str | None:
    """The pin a WebSocket's `?model=` asks for: a served name or any `name@version` (other
    names, such as the SDKs' own model names, have always meant the server's model)."""
    if asked is None:
        return None
    models: ModelRegistry = app.state.models
    served_names = {served.name for served in models.versions()}
    return asked if "@" in asked or asked in served_names else None


__all__ = ["UnknownModelError", "pinned_factory", "websocket_model"]
