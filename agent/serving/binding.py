"""The model version one call talks to: the one it started on (its session's `model`, else
its name's default at that moment), until its session pins another, which takes over at the
next turn boundary (no turn of the call in flight). The call's session runs its turns through
this binding as through a pipeline; each turn's cancel reaches the version that runs it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agent.serving.registry import ModelRegistry, ServedVersion
from pipeline.turns.events import Event, Turn


class UnknownModelError(ValueError):
    """A model id this server does not serve (the message names the ones it does)."""


def unknown_model(models: ModelRegistry, model_id: str) -> UnknownModelError:
    served = ", ".join(v.id for v in models.versions()) or "none"
    return UnknownModelError(f"the model {model_id!r} is not served here; the versions "
                             f"served are: {served} (GET /v1/models)")


class VersionBinding:
    """A call's hold on a model version: counted on it while the call lives."""

    def __init__(self, models: ModelRegistry, served: ServedVersion) -> None:
        self.models = models
        self.served = served
        self._pending: ServedVersion | None = None
        self._turns: dict[str, ServedVersion] = {}  # turns in flight -> the version running it
        self._released = False
        served.bindings.add(self)

    @property
    def id(self) -> str:
        return self.served.id

    @property
    def settings(self) -> Any:
        return self.served.pipeline.settings

    def serves(self, model_id: str) -> bool:
        """Whether `model_id` names a version this server serves (`name` or `name@version`)."""
        return self.models.resolve(model_id) is not None

    def pin(self, model_id: str) -> None:
        """Talk to `model_id` from the next turn boundary; UnknownModelError if not served."""
        served = self.models.resolve(model_id)
        if served is None:
            raise unknown_model(self.models, model_id)
        self._pending = None if served is self.served else served

    async def respond(self, turn: Turn, **options: Any) -> AsyncIterator[Event]:
        """The turn on the call's version (a pending pin taking over first, between turns)."""
        if self._pending is not None and not self._turns:
            self._move(self._pending)
        served = self.served
        self._turns[turn.turn_id] = served
        try:
            async for event in served.pipeline.respond(turn, **options):
                yield event
        finally:
            self._turns.pop(turn.turn_id, None)

    async def cancel(self, turn_id: str) -> bool:
        served = self._turns.get(turn_id, self.served)
        return bool(await served.pipeline.cancel(turn_id))

    def release(self) -> None:
        """The call ended: it no longer holds its version."""
        self._released = True
        self.served.bindings.discard(self)

    @property
    def model_id(self) -> str:
        """The version the call's session names: its pin still to take over, else its own."""
        return (self._pending or self.served).id

    def _move(self, served: ServedVersion) -> None:
        self.served.bindings.discard(self)
        served.bindings.add(self)
        self.served, self._pending = served, None


def call_pipeline(models: ModelRegistry, model_id: str | None, pipeline: Any) -> Any:
    """What a new call's session runs its turns on: a binding to the version `model_id` names
    (checked by whoever took the call), else to its name's default now; the bare `pipeline`
    on a server whose pipeline has no served version (a test's stand-in)."""
    served = models.resolve(model_id or models.primary)
    if served is None:
        if model_id is not None:
            raise unknown_model(models, model_id)
        return pipeline
    return VersionBinding(models, served)
