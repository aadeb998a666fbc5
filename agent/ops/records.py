"""Call records: every call and each of its turns, kept in SQLite under the data directory.

A turn is written (and committed on its own) the moment it completes, so a crash of the API
process — kill -9 included — loses nothing that had completed. The database runs in WAL mode:
the GET route's reads never wait behind a write, and a commit is one append to the log.

sqlite3 is synchronous, so nothing here touches the database from the event loop. One writer
thread owns the only connection and runs jobs from a bounded queue, in order:

- one thread rather than `asyncio.to_thread` with a connection per thread: SQLite takes one
  writer at a time anyway (several would only queue on its file lock and risk SQLITE_BUSY), a
  connection is tied to the thread that made it, and the default executor is shared with other
  work whose threads would each hold a connection forever;
- reads go through the same queue, behind every write submitted before them: a reader that saw
  `response.done` (the turn is queued before that event is sent) always finds the turn;
- a full queue (the disk stalls, or something else holds the database's lock) drops the new
  record with an error log and a count (`dropped`): blocking the producer would block the event
  loop, and with it the audio pacing of every live call. Losing a record is the lesser harm.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DB_NAME = "records.sqlite3"
SCHEMA_VERSION = 2  # 2: calls.aliases
QUEUE_MAX = 1024  # records waiting for the writer; a turn is one record, so this is minutes
BUSY_TIMEOUT_S = 10.0  # how long a write waits for another process's lock on the database
CLOSE_TIMEOUT_S = 5.0  # shutdown waits this long for the queue to drain (SIGTERM has 30 s)
DROP_LOG_EVERY_S = 5.0  # a stalled disk drops many records: one error line per interval

SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    call_id    TEXT PRIMARY KEY,
    profile    TEXT,
    started_at REAL NOT NULL,     -- unix seconds: the call was answered
    ended_at   REAL,              -- NULL while live, or when the server died first
    end_reason TEXT,              -- hangup, connection_closed, connect_timeout, ...
    aliases    TEXT               -- JSON: the OpenAI names its session used and what they meant
);
CREATE TABLE IF NOT EXISTS turns (
    call_id          TEXT NOT NULL,
    turn_id          TEXT NOT NULL,
    response_id      TEXT NOT NULL UNIQUE,
    item_id          TEXT NOT NULL,   -- the assistant item
    user_item_id     TEXT,            -- the (last) user item the reply answered
    user_transcript  TEXT,
    agent_transcript TEXT NOT NULL,   -- for a cut reply: what the caller heard
    status           TEXT NOT NULL CHECK (status IN ('completed', 'cancelled', 'failed')),
    reason           TEXT,            -- why it was cancelled
    error            TEXT,            -- why it failed
    started_at       REAL NOT NULL,   -- unix seconds
    first_audio_ms   REAL,            -- after started_at: first audio queued for the caller
    first_frame_ms   REAL,            -- after started_at: first frame handed to the sender
    ended_at         REAL NOT NULL,   -- unix seconds
    audio_ms         INTEGER NOT NULL,  -- agent audio generated
    cut_ms           INTEGER,         -- the audio was cut here (barge-in, cancel, truncate)
    underruns        INTEGER NOT NULL,
    usage            TEXT             -- JSON: the pipeline's token counts and stage times
);
CREATE INDEX IF NOT EXISTS turns_by_call ON turns (call_id, started_at);
"""


class RecordsBusyError(RuntimeError):
    """The writer's queue is full: the record (or read) was not taken."""


@dataclass(frozen=True)
class TurnRecord:
    """One finished turn as it is stored (a row of `turns`)."""

    call_id: str
    turn_id: str
    response_id: str
    item_id: str
    user_item_id: str | None
    user_transcript: str | None
    agent_transcript: str
    status: str
    reason: str | None
    error: str | None
    started_at: float
    first_audio_ms: float | None
    first_frame_ms: float | None
    ended_at: float
    audio_ms: int
    cut_ms: int | None
    underruns: int
    usage: str | None


Job = Callable[[sqlite3.Connection], Any]


class CallRecords:
    """The record store: open it once (lifespan), hand it to every call, close it last.

    Producers (`call_started`, `call_ended`, `add_turn`) run on the event loop and never
    block; they return whether the record was queued. A store made with `data_dir=None`, or
    not open, takes nothing (a server built without its lifespan, and unit tests of calls).
    """

    def __init__(self, data_dir: Path | None, queue_max: int = QUEUE_MAX) -> None:
        self.path = data_dir / DB_NAME if data_dir is not None else None
        self.dropped = 0
        self._queue: queue.Queue[tuple[Job, concurrent.futures.Future[Any] | None] | None] = (
            queue.Queue(maxsize=queue_max)
        )
        self._thread: threading.Thread | None = None
        self._last_drop_log = 0.0

    @property
    def is_open(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- lifetime (blocking: call through asyncio.to_thread) ----------------------------------

    def open(self) -> None:
        """Create the data directory and database if missing and start the writer; raise with
        the reason if the database cannot be opened."""
        if self.path is None or self.is_open:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        opened: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._serve, args=(self.path, opened), name="omnivox-records", daemon=True
        )
        self._thread.start()
        try:
            opened.result()
        except BaseException:
            self._thread = None
            raise
        log.info("call records in %s", self.path)

    def close(self) -> None:
        """Write everything queued, then close the database."""
        thread = self._thread
        if thread is None:
            return
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        with contextlib.suppress(queue.Full):  # a stalled writer: the log below says so
            self._queue.put(None, timeout=CLOSE_TIMEOUT_S)
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            log.error("call records: writer stalled at shutdown, about %d records not written",
                      self._queue.qsize() + 1)
        self._thread = None

    # -- producers (event loop, never block) --------------------------------------------------

    def call_started(self, call_id: str, profile: str,
                     aliases: dict[str, Any] | None = None) -> bool:
        started = time.time()
        return self._submit(
            lambda db: db.execute(
                "INSERT OR IGNORE INTO calls (call_id, profile, started_at, aliases) "
                "VALUES (?, ?, ?, ?)",
                (call_id, profile, started, json.dumps(aliases) if aliases else None),
            )
        )

    def call_aliases(self, call_id: str, aliases: dict[str, Any]) -> bool:
        """Keep what the OpenAI names a started call's session used resolved to (all so far)."""
        text = json.dumps(aliases)
        return self._submit(
            lambda db: db.execute("UPDATE calls SET aliases = ? WHERE call_id = ?",
                                  (text, call_id)))

    def call_ended(self, call_id: str, reason: str) -> bool:
        """Mark a started call ended (a call never answered has no row and gets none)."""
        ended = time.time()
        return self._submit(
            lambda db: db.execute(
                "UPDATE calls SET ended_at = ?, end_reason = ? "
                "WHERE call_id = ? AND ended_at IS NULL",
                (ended, reason, call_id),
            )
        )

    def first_frame_sent(self, response_id: str, first_frame_ms: float | None) -> bool:
        """Add the first frame's time to a turn recorded before it was sent: a reply whose
        audio was all queued when it ended (one prepared at the caller's pause and taken whole
        at the end of the turn) ends before the sender's next 20 ms tick."""
        sql = ("UPDATE turns SET first_frame_ms = ? "
               "WHERE response_id = ? AND first_frame_ms IS NULL")
        return self._submit(lambda db: db.execute(sql, (first_frame_ms, response_id)))

    def add_turn(self, record: TurnRecord) -> bool:
        """Record a turn that just ended (the session's one hook)."""
        row = vars(record)  # shallow: every field is a plain value
        sql = f"INSERT INTO turns ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})"
        return self._submit(lambda db: db.execute(sql, tuple(row.values())))

    def _submit(self, job: Job) -> bool:
        if not self.is_open:
            return False
        try:
            self._queue.put_nowait((job, None))
        except queue.Full:
            self._dropped_one()
            return False
        return True

    def _dropped_one(self) -> None:
        self.dropped += 1
        now = time.monotonic()
        if now - self._last_drop_log >= DROP_LOG_EVERY_S:
            self._last_drop_log = now
            log.error(
                "call records: writer queue full (%d), record dropped (%d dropped so far)",
                self._queue.maxsize,
                self.dropped,
            )

    # -- reads --------------------------------------------------------------------------------

    async def call_record(self, call_id: str) -> dict[str, Any] | None:
        """The call's row and its turns in order, or None for an id never recorded. Raises
        RecordsBusyError when the writer's queue is full."""
        if not self.is_open:
            raise RecordsBusyError("call records are not open")
        done: concurrent.futures.Future[dict[str, Any] | None] = concurrent.futures.Future()
        try:
            self._queue.put_nowait((lambda db: read_call(db, call_id), done))
        except queue.Full:
            raise RecordsBusyError("call records are busy, try again") from None
        return await asyncio.wrap_future(done)

    # -- the writer thread --------------------------------------------------------------------

    def _serve(self, path: Path, opened: concurrent.futures.Future[None]) -> None:
        try:
            db = connect(path)
        except BaseException as exc:
            opened.set_exception(exc)
            return
        opened.set_result(None)
        try:
            while (entry := self._queue.get()) is not None:
                job, done = entry
                try:
                    with db:  # one transaction per job: committed before the next starts
                        result = job(db)
                except Exception as exc:
                    log.error("call records: write failed: %s", exc)
                    if done is not None:
                        done.set_exception(exc)
                else:
                    if done is not None:
                        done.set_result(result)
        finally:
            db.close()


def connect(path: Path) -> sqlite3.Connection:
    """Open (creating if needed) the records database in WAL mode with its schema."""
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S)
    db.row_factory = sqlite3.Row
    try:
        mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise sqlite3.OperationalError(f"{path}: WAL mode refused (journal_mode {mode})")
        # FULL: each commit is fsynced, so a completed turn survives a power cut too, not just
        # a crash of this process; at one commit per turn the cost is nothing.
        db.execute("PRAGMA synchronous = FULL")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.OperationalError(
                f"{path}: records schema {version} is newer than this omnivox ({SCHEMA_VERSION})"
            )
        db.executescript(SCHEMA)
        columns = {row["name"] for row in db.execute("PRAGMA table_info(calls)")}
        if "aliases" not in columns:  # a version 1 database
            db.execute("ALTER TABLE calls ADD COLUMN aliases TEXT")
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        db.close()
        raise
    return db


def read_call(db: sqlite3.Connection, call_id: str) -> dict[str, Any] | None:
    """A call's record as the API returns it."""
    call = db.execute("SELECT * FROM calls WHERE call_id = ?", (call_id,)).fetchone()
    turns = db.execute(
        "SELECT * FROM turns WHERE call_id = ? ORDER BY started_at, rowid", (call_id,)
    ).fetchall()
    if call is None and not turns:
        return None
    record: dict[str, Any] = {"object": "call.record", "id": call_id}
    fields = ("profile", "started_at", "ended_at", "end_reason", "aliases")
    record.update({k: call[k] for k in fields} if call is not None else dict.fromkeys(fields))
    record["aliases"] = json.loads(record["aliases"]) if record["aliases"] else {}
    record["turns"] = [_turn_json(row) for row in turns]
    return record


def _turn_json(row: sqlite3.Row) -> dict[str, Any]:
    turn = {k: row[k] for k in row.keys() if k != "call_id"}  # noqa: SIM118 (Row has no iter of keys)
    turn["usage"] = json.loads(turn["usage"]) if turn["usage"] else None
    return turn
