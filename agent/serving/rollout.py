"""Rollouts of a new model version onto the running server, and retiring a version.

versioned: the new version's workers start beside the old, are checked (ready, then canary
turns that must speak, and for a version that declares an output schema a completion that must
be valid JSON for it), and it becomes its name's default: unpinned new callers get it, callers
pinned to the old keep it until an operator retires it. red-black: the same start and checks,
then new callers shift to it in steps (each step re-checks it), the old takes no new caller and
drains (calls on it finish there), then its workers stop. A failed check rolls back at once:
the old version serves as before, the new one's workers stop, the state says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.config import Settings
from agent.profiles import build_pipeline
from agent.serving.canary import CanaryFailed, canary_json, canary_turn
from agent.serving.registry import ModelRegistry, ServedVersion, VersionState
from agent.serving.rollout_state import Phase, RolloutState, Strategy, load, save
from pipeline.version_checks import declared_output_schema

log = logging.getLogger(__name__)
POLL_S = 0.2


@dataclass(frozen=True)
class RolloutRefused(Exception):
    """A rollout or retire refused before anything changed: an HTTP status, a code, why."""

    status: int
    code: str
    message: str


class CheckFailed(Exception):
    """A check of the new version failed: the rollout rolls back (the message says why)."""


@dataclass(frozen=True)
class RolloutTimes:
    start_timeout_s: float = 600.0  # the new version's workers ready (engines load slowly)
    canary_timeout_s: float = 120.0  # one canary turn
    step_s: float = 2.0  # how long each shift step holds before the next
    drain_timeout_s: float = 600.0  # then calls left on the old move at their next turn
    requests_drain_s: float = 30.0  # requests in flight on a version finish before it stops


class Rollouts:
    """The server's one rollout at a time (and the last one's state), and retiring versions."""

    def __init__(self, models: ModelRegistry, settings: Settings,
                 times: RolloutTimes | None = None,
                 build: Callable[[Settings], Any] = build_pipeline) -> None:
        self.models = models
        self.settings = settings
        self.times = times or RolloutTimes()
        self.build = build  # a version's pipeline from its settings (not started)
        self.state: RolloutState | None = None
        self._task: asyncio.Task[None] | None = None
        self._started: set[ServedVersion] = set()  # what a rollout started: stops with the app
        # Versions taken out of service whose workers are not the registry's to stop (the app
        # was handed a pipeline it does not own): a rollout back to one serves it again.
        self._parked: dict[str, ServedVersion] = {}
        self._restoring: list[asyncio.Task[None]] = []  # versions served again after a restart

    # -- starting one ---------------------------------------------------------------------

    def begin(self, model_id: str, strategy: Strategy, steps: list[int] | None = None,
              canary_turns: int = 1) -> RolloutState:
        """Start rolling `model_id` (`name@version`) out; RolloutRefused if it cannot be."""
        if self._task is not None and not self._task.done():
            raise RolloutRefused(409, "rollout_in_progress",
                                 f"a rollout to {self.state.target_id if self.state else '?'} "
                                 "is in progress: wait for it (GET /v1/models/rollout)")
        name, _, version = model_id.partition("@")
        current = self.models.default(name)
        if not version.isdigit() or version.startswith("0"):
            raise RolloutRefused(400, "invalid_model", f"name a version: NAME@N, not {model_id!r}")
        if current is None or name != self.models.primary:
            raise RolloutRefused(404, "model_not_found",
                                 f"{name!r} is not a model served here (its profile: "
                                 f"{self.models.primary!r})")
        if current.version == version:
            raise RolloutRefused(409, "already_default", f"{model_id} is already the default")
        if not 1 <= canary_turns <= 10:
            raise RolloutRefused(400, "invalid_canary_turns", "canary_turns must be 1..10")
        self.state = RolloutState(name, version, current.version, strategy,
                                  _steps(steps, strategy), canary_turns)
        self._settle(self.state)  # what a restart before it is over serves again
        self._task = asyncio.create_task(self._run(self.state))
        return self.state

    async def wait(self) -> RolloutState | None:
        """The rollout in progress once it is over (or the last one's state)."""
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._task)
        return self.state

    # -- running it -----------------------------------------------------------------------

    async def _run(self, state: RolloutState) -> None:
        old = self.models.get(state.previous_id)
        new, started_here = self.models.get(state.target_id), False
        if new is None and state.target_id in self._parked:  # a rollback parks it again
            new, started_here = self._parked.pop(state.target_id), True
            new.state = VersionState.CHECKING
            self.models.add(new)
        log.info("rollout %s -> %s (%s) begins", state.previous_id, state.target_id,
                 state.strategy)
        try:
            if new is None:
                new, started_here = self._add(state.name, state.target), True
                await self._start(state, new)
            await self._check(state, new)
            if state.strategy == Strategy.RED_BLACK:
                await self._shift(state, new)
            else:
                new.state = VersionState.SERVING
                self.models.set_default(new)
                state.percent = 100
        except asyncio.CancelledError:
            await self._roll_back(state, new, old, started_here, "the API stopped")
            raise
        except Exception as exc:  # any failure of any check: back at once, saying why
            await self._roll_back(state, new, old, started_here, str(exc) or repr(exc))
            return
        if state.strategy == Strategy.RED_BLACK and old is not None:
            self._phase(state, Phase.DRAINING)
            await self._drain(old, new)
        self._settle(state)
        self._phase(state, Phase.DONE)
        log.info("rollout to %s done", state.target_id)

    def _add(self, name: str, version: str,
             serving: VersionState = VersionState.STARTING) -> ServedVersion:
        """A version new to the registry, its pipeline built (not started) and listed in
        state `serving` (a rollout's new version: starting)."""
        settings = self.settings.model_copy(update={"model_version": version})
        pipeline = self.build(settings)
        new = ServedVersion(name, pipeline.settings.version, pipeline.settings.family,
                            pipeline, owned=True, state=serving)
        self.models.add(new)
        self._started.add(new)
        return new

    async def _start(self, state: RolloutState, new: ServedVersion) -> None:
        self._phase(state, Phase.STARTING)
        try:
            await asyncio.wait_for(new.pipeline.start(), self.times.start_timeout_s)
        except TimeoutError:
            raise CheckFailed(f"{new.id}'s workers were not up within "
                              f"{self.times.start_timeout_s:g} s") from None
        except Exception as exc:  # its version refused, a build failed: one line says why
            raise CheckFailed(f"{new.id} did not start: {exc}") from None

    async def _check(self, state: RolloutState, new: ServedVersion) -> None:
        """Readiness, then the canary turns: each must end with audible speech; then, for a
        version that declares an output schema, a completion guided by it: valid JSON for it."""
        self._phase(state, Phase.CHECKING)
        if new.state != VersionState.SERVING:  # one already serving keeps its pinned callers
            new.state = VersionState.CHECKING
        self._ready_or_fail(new)
        conversation = self.settings.conversation
        for n in range(state.canary_turns):
            try:
                result = await canary_turn(new.pipeline, f"canary-{new.id}-{n + 1}",
                                           conversation.instructions, conversation.voice,
                                           self.times.canary_timeout_s)
            except CanaryFailed as exc:
                raise CheckFailed(f"{new.id}: {exc}") from None
            state.canary.append({"turn": n + 1, "audio_ms": result.audio_ms,
                                 "first_audio_s": result.first_audio_s,
                                 "seconds": result.seconds})
            self._save(state)
        schema = await asyncio.to_thread(declared_output_schema, new.model, new.family)
        if schema is not None:
            try:
                state.canary_json = await canary_json(new.pipeline, f"canary-{new.id}-json",
                                                      schema, self.times.canary_timeout_s)
            except CanaryFailed as exc:
                raise CheckFailed(f"{new.id}: {exc}") from None
            self._save(state)

    async def _shift(self, state: RolloutState, new: ServedVersion) -> None:
        """New callers move to `new` step by step; it is re-checked at every step."""
        self._phase(state, Phase.SHIFTING)
        new.state = VersionState.SERVING
        for percent in state.steps:
            state.percent = percent
            if percent >= 100:
                self.models.set_default(new)
                self.models.split(state.name, None)
            else:
                self.models.split(state.name, new.version, percent)
            self._save(state)
            log.info("rollout: %d%% of new %s callers to %s", percent, state.name, new.id)
            if percent < 100:
                await self._hold(new)

    async def _hold(self, new: ServedVersion) -> None:
        """One step's time, failing as soon as the new version is no longer ready."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self.times.step_s
        while loop.time() < until:
            self._ready_or_fail(new)
            await asyncio.sleep(POLL_S)

    def _ready_or_fail(self, new: ServedVersion) -> None:
        health = new.pipeline.health()
        if not health.ready:
            stages = "; ".join(f"{name} {status.state}" + (f" ({status.reason})"
                                                          if status.reason else "")
                               for name, status in health.stages.items()
                               if status.state != "ready")
            raise CheckFailed(f"{new.id} is not ready: {stages}")

    async def _drain(self, old: ServedVersion, new: ServedVersion) -> None:
        """The old version takes no new caller; once the calls on it have ended (or the drain
        bound has passed: those left move to `new` at their next turn), its workers stop."""
        old.state = VersionState.DRAINING
        loop = asyncio.get_running_loop()
        until = loop.time() + self.times.drain_timeout_s
        while old.calls and loop.time() < until:
            await asyncio.sleep(POLL_S)
        if old.calls:
            log.warning("drain of %s: %d call(s) still on it after %.0f s move to %s",
                        old.id, old.calls, self.times.drain_timeout_s, new.id)
        await self._remove(old, new)

    async def _remove(self, old: ServedVersion, to: ServedVersion | None) -> int:
        """Take `old` out of service: its calls move to `to` at their next turn, its workers
        stop (when the registry started them). The number of calls moved."""
        moved = list(old.bindings)
        for binding in moved:
            if to is not None:
                binding.pin(to.id)
        self.models.remove(old.id)
        if old.owned:
            await self._quiet(old)
            await old.pipeline.stop()
            log.info("%s retired: its workers stopped", old.id)
        else:
            self._parked[old.id] = old
            log.info("%s retired (its workers are not this server's to stop)", old.id)
        return len(moved)

    async def _quiet(self, old: ServedVersion) -> None:
        """Requests already on a version taken out of service (completions, speech) finish
        before its workers stop, for at most `requests_drain_s`."""
        active = getattr(old.pipeline, "active_requests", None)
        loop = asyncio.get_running_loop()
        until = loop.time() + self.times.requests_drain_s
        while active is not None and loop.time() < until:
            try:
                held = await active()
            except Exception:  # a stage not ready: it holds nothing worth waiting for
                return
            if not any(reply.engine_ids or reply.serving_ids for reply in held.values()):
                return
            await asyncio.sleep(POLL_S)

    async def _roll_back(self, state: RolloutState, new: ServedVersion | None,
                         old: ServedVersion | None, started_here: bool, reason: str) -> None:
        log.error("rollout to %s rolls back: %s", state.target_id, reason)
        self.models.split(state.name, None)
        if old is not None:
            old.state = VersionState.SERVING
            self.models.set_default(old)
        state.percent, state.reason = 0, reason
        if new is not None and started_here:
            await self._remove(new, old)
        elif new is not None:
            new.state = VersionState.SERVING
        self._settle(state)
        self._phase(state, Phase.ROLLED_BACK)

    # -- retiring -------------------------------------------------------------------------

    async def retire(self, model_id: str, force: bool = False) -> dict[str, Any]:
        """Stop serving `model_id` (a version that is not its name's default); refused while
        calls are pinned to it unless `force` (they move to the default at their next turn)."""
        served = self.models.get(model_id)
        if served is None:
            raise RolloutRefused(404, "model_not_found", f"{model_id!r} is not served here")
        if self._task is not None and not self._task.done() and self.state is not None and \
                model_id in (self.state.target_id, self.state.previous_id):
            raise RolloutRefused(409, "rollout_in_progress",
                                 f"{model_id} is part of the rollout in progress")
        default = self.models.default(served.name)
        if default is served or default is None:
            raise RolloutRefused(409, "model_is_default", f"{model_id} is the default of "
                                 f"{served.name!r}: roll out another version first")
        if served.calls and not force:
            raise RolloutRefused(409, "model_in_use",
                                 f"{served.calls} live call(s) pinned to {model_id}: retire it "
                                 f"once they end, or force it (they move to {default.id} at "
                                 "their next turn)")
        served.state = VersionState.DRAINING
        moved = await self._remove(served, default)
        if self.state is not None and self.state.name == served.name:
            self._settle(self.state)
            self._save(self.state)
        return {"object": "model.retired", "id": model_id, "calls_moved": moved,
                "workers_stopped": served.owned}

    # -- state ----------------------------------------------------------------------------

    def _phase(self, state: RolloutState, phase: Phase) -> None:
        state.phase = phase
        self._save(state)

    def _settle(self, state: RolloutState) -> None:
        """Note the versions of its name serving now: what a restart serves again."""
        state.serving = sorted((v.version for v in self.models.versions()
                                if v.name == state.name), key=int)

    def _save(self, state: RolloutState) -> None:
        try:  # a few hundred bytes: written inline, as the records' small writes
            save(self.settings.data_dir, state)
        except OSError as exc:
            log.warning("rollout state not saved in %s: %s", self.settings.data_dir, exc)

    def recover(self) -> None:
        """At start: a rollout the last process left half-done is rolled back (its new
        version's workers died with that process; the old serves, as this one starts it)."""
        state = load(self.settings.data_dir)
        if state is not None and not state.phase.over:
            state.reason = (f"the API restarted during the rollout ({state.phase}): "
                            f"rolled back to {state.previous_id}; run it again")
            state.percent = 0
            self._phase(state, Phase.ROLLED_BACK)
            log.warning("rollout to %s: %s", state.target_id, state.reason)
        self.state = state

    def restore(self) -> list[asyncio.Task[None]]:
        """At start, after `recover`: the versions the last rollout left serving beside its
        default serve again (their workers start in the background, as the default's do), so
        callers pinned to them keep them across a restart. Only when this server serves that
        default (a version chosen by flag or environment instead: it alone). The starts."""
        state = self.state
        default = None if state is None else self.models.default(state.name)
        if state is None or default is None or default.version != state.default:
            return []
        for version in state.serving:
            if self.models.get(f"{state.name}@{version}") is not None:
                continue
            try:
                served = self._add(state.name, version, VersionState.SERVING)
            except Exception as exc:  # its pipeline cannot even be built: the others still are
                log.error("%s@%s, served before the restart, cannot be built again: %s",
                          state.name, version, exc)
                continue
            self._restoring.append(asyncio.create_task(self._serve_again(served, default)))
        return self._restoring

    async def _serve_again(self, served: ServedVersion, default: ServedVersion) -> None:
        """Start a restored version's workers; one that cannot start is served no more (its
        pinned callers get 404 naming the versions served), saying why."""
        try:
            await asyncio.wait_for(served.pipeline.start(), self.times.start_timeout_s)
            log.info("%s serves again after the restart, beside %s", served.id, default.id)
            return
        except Exception as exc:  # not built any more, a file changed, too slow: one line
            log.error("%s, served before the restart, cannot start again: %s", served.id,
                      str(exc) or repr(exc))
        await self._remove(served, default)
        if self.state is not None:
            self._settle(self.state)
            self._save(self.state)

    async def close(self) -> None:
        """The app stops: a rollout in progress rolls back, versions it started stop."""
        for restoring in self._restoring:
            restoring.cancel()
        await asyncio.gather(*self._restoring, return_exceptions=True)
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for served in self._started:
            await served.pipeline.stop()


def _steps(steps: list[int] | None, strategy: Strategy) -> list[int]:
    """The shift's shares of new callers: rising, 1..100, ending at 100."""
    if strategy == Strategy.VERSIONED or not steps:
        return [100]
    if any(not 1 <= s <= 100 for s in steps) or steps != sorted(set(steps)):
        raise RolloutRefused(400, "invalid_steps",
                             f"steps must rise within 1..100 (e.g. 10,50,100), not {steps}")
    return steps if steps[-1] == 100 else [*steps, 100]
