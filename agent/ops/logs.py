"""The API process's log records: readable text by default, or one JSON object per line, each
tagged with the call and turn it was emitted for.

The ids live in context variables: a call binds its id where it is answered, so every task it
starts from there (aiortc's transports, the media tasks, its replies) inherits it; a reply binds
its turn id around the tasks that run it. A filter on the handler copies them onto each record,
whatever logger emitted it (uvicorn, aiortc, the pipeline client), so no log call passes them.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TextIO

CALL_ID: ContextVar[str | None] = ContextVar("omnivox_call_id", default=None)
TURN_ID: ContextVar[str | None] = ContextVar("omnivox_turn_id", default=None)

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s%(ids)s: %(message)s"


def bind_call(call_id: str) -> None:
    """Tag the rest of the current task, and every task it creates from now on, with a call."""
    CALL_ID.set(call_id)


@contextlib.contextmanager
def context(*, call_id: str | None = None, turn_id: str | None = None) -> Iterator[None]:
    """Within the block, and in every task created inside it, records carry these ids."""
    tokens = []
    if call_id is not None:
        tokens.append((CALL_ID, CALL_ID.set(call_id)))
    if turn_id is not None:
        tokens.append((TURN_ID, TURN_ID.set(turn_id)))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


class ContextFilter(logging.Filter):
    """Puts the current call_id and turn_id on every record (None outside calls and turns)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "call_id", None) is None:
            record.call_id = CALL_ID.get()
        if getattr(record, "turn_id", None) is None:
            record.turn_id = TURN_ID.get()
        return True


class TextFormatter(logging.Formatter):
    """`time LEVEL logger [call/turn]: message`; the brackets only inside a call or turn."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        record.ids = _ids(getattr(record, "call_id", None), getattr(record, "turn_id", None))
        return super().format(record)


def _ids(call_id: str | None, turn_id: str | None) -> str:
    if turn_id is None:
        return f" [{call_id}]" if call_id else ""
    if call_id and turn_id.startswith(f"{call_id}-"):  # the session's ids: CALL-turnN
        return f" [{call_id}/{turn_id[len(call_id) + 1:]}]"
    return f" [{call_id or '-'}/{turn_id}]"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ts (UTC, ISO 8601), level, logger, message,
    call_id, turn_id, and exc / stack when the record has them."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "call_id": getattr(record, "call_id", None),
            "turn_id": getattr(record, "turn_id", None),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def handler(log_format: str, stream: TextIO | None = None) -> logging.Handler:
    """A handler writing records in `log_format` (text or json), tagged with call and turn."""
    out = logging.StreamHandler(stream)  # None: stderr
    out.addFilter(ContextFilter())
    out.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    return out


def configure(level: str, log_format: str = "text") -> None:
    """Send every record of this process (uvicorn's too, when it is run without its own
    log_config) through one handler on stderr, replacing any there was."""
    logging.basicConfig(level=level.upper(), handlers=[handler(log_format)],
                        force=True)
