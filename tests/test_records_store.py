"""The call records' store on its own: its schema and WAL database, turns in the order they
started, a stalled database filling the bounded queue, a directory that cannot be made, a turn's
record taken from its reply, and a first frame sent after the turn was recorded."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from pathlib import Path

import pytest

from agent.ops.records import (
    DB_NAME,
    SCHEMA_VERSION,
    CallRecords,
    RecordsBusyError,
    TurnRecord,
)
from agent.realtime.history import Conversation
from agent.realtime.reply import Reply
from agent.realtime.turn_record import after_start_ms, turn_record
from tests.product_calls import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="session")

TURN_COLUMNS = {
    "call_id", "turn_id", "response_id", "item_id", "user_item_id", "user_transcript",
    "agent_transcript", "status", "reason", "error", "started_at", "first_audio_ms",
    "first_frame_ms", "ended_at", "audio_ms", "cut_ms", "underruns", "usage",
}


def a_turn(call_id: str, n: int, started_at: float, status: str = "completed") -> TurnRecord:
    return TurnRecord(
        call_id=call_id, turn_id=f"{call_id}-turn{n}", response_id=f"resp_{call_id}_{n}",
        item_id=f"item_{n}", user_item_id=None, user_transcript=f"question {n}",
        agent_transcript=f"answer {n}", status=status, reason=None, error=None,
        started_at=started_at, first_audio_ms=120.0, first_frame_ms=130.0,
        ended_at=started_at + 1, audio_ms=900, cut_ms=None, underruns=0,
        usage='{"thinker_tokens": 7}',
    )


async def test_store_creates_its_directory_and_a_wal_database(tmp_path: Path) -> None:
    data = tmp_path / "not" / "yet"
    store = CallRecords(data)
    await asyncio.to_thread(store.open)
    try:
        assert store.call_started("rtc_a", "tiny")
        # Turns come back in the order they started, not the order they were written.
        assert store.add_turn(a_turn("rtc_a", 2, started_at=2000.0, status="cancelled"))
        assert store.add_turn(a_turn("rtc_a", 1, started_at=1000.0))
        assert store.add_turn(a_turn("rtc_b", 1, started_at=1500.0))  # another call's turn
        assert store.call_ended("rtc_a", "hangup")
        assert store.call_ended("rtc_never_answered", "hangup")  # queued, but makes no row
        record = await store.call_record("rtc_a")
        assert await store.call_record("rtc_unknown") is None
        assert await store.call_record("rtc_never_answered") is None
    finally:
        await asyncio.to_thread(store.close)

    assert (record["id"], record["profile"], record["end_reason"]) == ("rtc_a", "tiny", "hangup")
    assert record["started_at"] <= record["ended_at"]
    assert [t["turn_id"] for t in record["turns"]] == ["rtc_a-turn1", "rtc_a-turn2"]
    assert [t["status"] for t in record["turns"]] == ["completed", "cancelled"]
    assert record["turns"][0]["usage"] == {"thinker_tokens": 7}
    assert record["turns"][0]["user_transcript"] == "question 1"

    with sqlite3.connect(data / DB_NAME) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        columns = {row[1] for row in db.execute("PRAGMA table_info(turns)")}
        assert columns == TURN_COLUMNS
        assert db.execute("SELECT count(*) FROM turns").fetchone()[0] == 3
        assert db.execute("SELECT count(*) FROM calls").fetchone()[0] == 1
        with pytest.raises(sqlite3.IntegrityError):  # an outcome outside the three is refused
            db.execute("INSERT INTO turns (call_id, turn_id, response_id, item_id, "
                       "agent_transcript, status, started_at, ended_at, audio_ms, underruns) "
                       "VALUES ('c', 't', 'r', 'i', '', 'maybe', 0, 0, 0, 0)")

    # A second open of the same directory keeps what is there.
    again = CallRecords(data)
    await asyncio.to_thread(again.open)
    try:
        assert len((await again.call_record("rtc_a"))["turns"]) == 2
    finally:
        await asyncio.to_thread(again.close)


async def test_a_stalled_database_fills_the_bounded_queue_then_drops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another connection holds the write lock (as a stalled disk would hold the writer): the
    writer waits, the queue fills to its bound, further records are refused at once and counted,
    and once the lock goes everything that was queued is written."""
    store = CallRecords(tmp_path, queue_max=4)
    await asyncio.to_thread(store.open)
    blocker = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)
    try:
        blocker.execute("BEGIN EXCLUSIVE")
        assert store.add_turn(a_turn("rtc_s", 0, started_at=0.0))
        # The writer took that record and now waits on the lock: the queue is empty again.
        await wait_until(lambda: store._queue.qsize() == 0, 10, "the writer to take a record")
        with caplog.at_level(logging.ERROR, logger="agent.ops.records"):
            accepted = [store.add_turn(a_turn("rtc_s", n, started_at=n)) for n in range(1, 8)]
        assert accepted == [True] * 4 + [False] * 3
        assert store.dropped == 3
        assert store._queue.qsize() == 4
        assert any("record dropped" in r.getMessage() for r in caplog.records)
        with pytest.raises(RecordsBusyError):  # a read is refused too (the API says 503)
            await store.call_record("rtc_s")
        blocker.execute("ROLLBACK")
        await wait_until(lambda: store._queue.qsize() == 0, 30, "the queue to drain")
        record = await store.call_record("rtc_s")
    finally:
        blocker.close()
        await asyncio.to_thread(store.close)
    assert [t["turn_id"] for t in record["turns"]] == [f"rtc_s-turn{n}" for n in range(5)]


async def test_a_data_dir_that_cannot_be_made_stops_the_open(tmp_path: Path) -> None:
    occupied = tmp_path / "a-file"
    occupied.write_text("not a directory")
    store = CallRecords(occupied / "data")
    with pytest.raises(OSError):
        await asyncio.to_thread(store.open)
    assert not store.is_open
    assert not store.call_started("rtc_x", "tiny")  # a store that is not open takes nothing


async def test_turn_record_takes_the_user_part_and_times_from_the_reply() -> None:
    loop = asyncio.get_running_loop()
    conversation = Conversation("be brief")
    conversation.add("item_a0", "assistant", "an earlier answer")
    conversation.add("item_u1", "user", "first typed")
    conversation.add("item_u2", "user", "second typed")
    conversation.add("item_a1", "assistant", "")
    conversation.add("item_u3", "user", "said after the reply began")  # not this turn's
    reply = Reply(response_id="resp_1", item_id="item_a1", turn_id="rtc_t-turn2",
                  user_item_id=None, started_at=loop.time() - 2.0)
    reply.first_audio_at = reply.started_at + 0.25
    reply.usage = {"thinker_tokens": 12, "first_audio_s": None}
    reply.cut_ms = 800
    before = time.time()
    record = turn_record("rtc_t", reply, conversation, "cancelled", "heard part",
                         reason="turn_detected")
    assert record.user_transcript == "first typed second typed"
    assert record.user_item_id == "item_u2"
    assert (record.status, record.reason, record.error) == ("cancelled", "turn_detected", None)
    assert record.first_audio_ms == 250.0 and record.first_frame_ms is None
    assert record.ended_at >= before
    assert 1.5 < record.ended_at - record.started_at < 10  # the loop's clock put on the wall's
    assert (record.cut_ms, record.agent_transcript) == (800, "heard part")
    assert record.usage == '{"thinker_tokens": 12, "first_audio_s": null}'


async def test_a_first_frame_sent_after_the_record_is_added_to_it(tmp_path: Path) -> None:
    """A reply taken whole at the end of the turn ends before its first frame is sent: the
    frame's time reaches its record afterwards, once, and only that turn's."""
    loop = asyncio.get_running_loop()
    store = CallRecords(tmp_path)
    await asyncio.to_thread(store.open)
    try:
        assert store.call_started("rtc_f", "tiny")
        reply = Reply(response_id="resp_f_1", item_id="item_a1", turn_id="rtc_f-turn1",
                      user_item_id=None, started_at=loop.time() - 1.0)
        reply.first_audio_at = reply.started_at + 0.001
        assert store.add_turn(turn_record("rtc_f", reply, Conversation(""), "completed", "hi"))
        assert store.add_turn(a_turn("rtc_f", 2, started_at=time.time() + 5))
        assert store.first_frame_sent(reply.response_id, after_start_ms(reply, reply.started_at
                                                                        + 0.0185))
        # a later edge does not move it
        assert store.first_frame_sent(reply.response_id, after_start_ms(reply, reply.started_at
                                                                        + 0.5))
        turns = (await store.call_record("rtc_f"))["turns"]
    finally:
        await asyncio.to_thread(store.close)
    assert [t["first_frame_ms"] for t in turns] == [18.5, 130.0]
