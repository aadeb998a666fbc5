"""The checked reach of one adapter module into one library's undocumented internals: what
the adapters to transformers and faster-whisper share. A reach whose name is gone raises the
adapter's own error naming it, the installed release and the module that must follow the
upgrade; on another release than the one the adapter was written for, the first reach logs a
warning once (each reach is checked either way)."""

from __future__ import annotations

import importlib.metadata
import logging
from typing import Any

_ABSENT = object()


class LibraryReach:
    """One adapter's reach into `distribution` (written for release `written_for`,
    major.minor); its failures are `error`s that name `adapter` (the module's path)."""

    def __init__(self, distribution: str, written_for: str, adapter: str,
                 error: type[RuntimeError], logger: logging.Logger) -> None:
        self.distribution = distribution
        self.written_for = written_for
        self.adapter = adapter
        self.error = error
        self.logger = logger
        self.noted = False

    def version(self) -> str:
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return "(not installed)"

    def written_for_installed(self) -> bool:
        """Whether the installed release is the one the adapter was written for."""
        return ".".join(self.version().split(".")[:2]) == self.written_for

    def note_version(self) -> None:
        """Warn once that the installed release is not the one written for."""
        if self.noted:
            return
        self.noted = True
        if not self.written_for_installed():
            self.logger.warning("%s %s is installed; %s was written for %s (each internal it "
                                "reaches is checked as it is used)", self.distribution,
                                self.version(), self.adapter, self.written_for)

    def missing(self, what: str, why: str) -> RuntimeError:
        return self.error(
            f"{self.distribution} {self.version()} has no {what} ({why}; written for "
            f"{self.written_for}): {self.adapter} must follow the upgrade")

    def attribute(self, owner: object, shown: str, name: str, why: str,
                  *, call: bool = False) -> Any:
        """`owner.name` (callable, with `call`); the adapter's error naming `shown.name`
        when it is gone (or not callable)."""
        self.note_version()
        value = getattr(owner, name, _ABSENT)
        if value is _ABSENT:
            raise self.missing(f"{shown}.{name}", why)
        if call and not callable(value):
            raise self.error(f"{self.distribution} {self.version()}'s {shown}.{name} is a "
                             f"{type(value).__name__}, not callable ({why})")
        return value
