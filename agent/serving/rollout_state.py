"""A rollout's state: what it moves to, how, how far it got and why it stopped; kept in the data
directory at every change so that an API restart finds it (rollout.py resumes or rolls back)."""

from __future__ import annotations

import enum
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.config import Settings

log = logging.getLogger(__name__)
STATE_FILE = "rollout.json"


class Strategy(enum.StrEnum):
    VERSIONED = "versioned"  # both serve; unpinned callers move to the new default
    RED_BLACK = "red-black"  # the new one takes every new caller; the old drains and stops


class Phase(enum.StrEnum):
    STARTING = "starting"  # the new version's workers start beside the old
    CHECKING = "checking"  # readiness and canary turns on the new version
    SHIFTING = "shifting"  # a share of new callers goes to it, in steps
    DRAINING = "draining"  # the old takes no new caller; those on it finish there
    DONE = "done"
    ROLLED_BACK = "rolled_back"  # a check failed: the old serves as before, the new is gone

    @property
    def over(self) -> bool:
        return self in (Phase.DONE, Phase.ROLLED_BACK)


@dataclass
class RolloutState:
    """One rollout of `name` from `previous` (its default then) to `target`."""

    name: str
    target: str  # the version rolled to
    previous: str  # the default it replaces
    strategy: Strategy
    steps: list[int] = field(default_factory=lambda: [100])  # shares of new callers, in %
    canary_turns: int = 1
    phase: Phase = Phase.STARTING
    percent: int = 0  # of new unpinned callers sent to the target now
    reason: str | None = None  # why it rolled back
    canary: list[dict[str, Any]] = field(default_factory=list)  # each canary turn's figures
    # The canary completion under the version's declared output schema (None: it declares none)
    canary_json: dict[str, Any] | None = None
    # The versions of `name` serving once it settled (before it, while it runs; after it once
    # over; a retire since): what a restarted server serves again beside the default.
    serving: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    @property
    def target_id(self) -> str:
        return f"{self.name}@{self.target}"

    @property
    def previous_id(self) -> str:
        return f"{self.name}@{self.previous}"

    @property
    def default(self) -> str:
        """The default it leaves: its target once done, else (cut short by a restart, or
        rolled back) the version it replaced."""
        return self.target if self.phase == Phase.DONE else self.previous

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "target": self.target_id, "previous": self.previous_id,
                "strategy": str(self.strategy), "phase": str(self.phase)}

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "strategy": str(self.strategy), "phase": str(self.phase)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutState:
        return cls(**{**data, "strategy": Strategy(data["strategy"]),
                      "phase": Phase(data["phase"])})


def save(directory: Path | None, state: RolloutState) -> None:
    """Write the state whole (a temporary file renamed over the last: never half a file)."""
    if directory is None:
        return
    state.updated_at = time.time()
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{STATE_FILE}.tmp"
    temporary.write_text(json.dumps(state.to_json(), indent=1))
    os.replace(temporary, directory / STATE_FILE)


def load(directory: Path | None) -> RolloutState | None:
    """The last rollout's state, or None (none recorded, or unreadable: logged)."""
    path = None if directory is None else directory / STATE_FILE
    if path is None or not path.exists():
        return None
    try:
        return RolloutState.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("ignoring the rollout state in %s: %s", path, exc)
        return None


def served_after_restart(settings: Settings) -> Settings:
    """The settings a restarted server serves with: unless `model_version` is set (flag or
    environment: it wins), the version the last rollout of this profile left as the default
    (rollout.py's `restore` then serves the others it left serving)."""
    if "model_version" in settings.model_fields_set:
        return settings
    state = load(settings.data_dir)
    if state is None or state.name != settings.profile:
        return settings
    version = state.default
    if version != settings.model_version:
        log.info("serving %s@%s, the default the last rollout (%s, %s) left", state.name,
                 version, state.target_id, state.phase)
    return settings.model_copy(update={"model_version": version})
