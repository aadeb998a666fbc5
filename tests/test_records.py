"""Call records: each call and each of its turns lands in SQLite (WAL) as it completes, survives
kill -9 of the API process, and `GET /v1/calls/{call_id}` returns it.

The store is exercised on its own (schema, order, a stalled database filling the bounded queue),
through media-only calls, through real calls on the tiny family (completed and cancelled turns),
and through `omnivox serve` killed with SIGKILL mid-reply."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from agent.ops.records import (
    DB_NAME,
    SCHEMA_VERSION,
    CallRecords,
    RecordsBusyError,
    TurnRecord,
    turn_record,
)
from agent.realtime.history import Conversation
from agent.realtime.reply import Reply
from tests.product_calls import (
    connect,
    long_replies,
    say,
    transcript_of,
    wait_until,
)
from tests.rtc_client import RtcCaller
from tests.served import Served
from tests.test_serve_process import OMNIVOX, free_port, get, wait_for

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


def call_id_of(caller: RtcCaller) -> str:
    return caller.location.rsplit("/", 1)[1]


async def get_record(base_url: str, call_id: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        return await http.get(f"/v1/calls/{call_id}")


# -- the store on its own -------------------------------------------------------------------


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
        assert store.turn_ended("rtc_f", reply, Conversation(""), "completed", "hi")
        assert store.add_turn(a_turn("rtc_f", 2, started_at=time.time() + 5))
        reply.first_frame_at = reply.started_at + 0.0185
        assert store.first_frame_sent(reply)
        reply.first_frame_at = reply.started_at + 0.5  # a later edge does not move it
        assert store.first_frame_sent(reply)
        turns = (await store.call_record("rtc_f"))["turns"]
    finally:
        await asyncio.to_thread(store.close)
    assert [t["first_frame_ms"] for t in turns] == [18.5, 130.0]


# -- the API, through media-only calls ------------------------------------------------------


async def test_record_of_a_call_and_404_for_an_unknown_one(media_server: Served) -> None:
    unknown = await get_record(media_server.url, "rtc_00000000000000000000")
    assert unknown.status_code == 404
    assert unknown.json() == {"error": {"type": "invalid_request_error",
                                        "code": "call_not_found",
                                        "message": "no record of call 'rtc_00000000000000000000'"}}
    caller = await connect(media_server.url)
    call_id = call_id_of(caller)
    live = await get_record(media_server.url, call_id)
    assert live.status_code == 200, live.text
    body = live.json()
    assert (body["id"], body["ended_at"], body["turns"]) == (call_id, None, [])
    await caller.hang_up()
    ended = (await get_record(media_server.url, call_id)).json()
    assert ended["end_reason"] == "hangup"
    assert ended["started_at"] <= ended["ended_at"] <= time.time()


# -- kill -9 of `omnivox serve` -----------------------------------------------------------
# Its own server's engines are gone before the next test; the shared `tiny_server` idles meanwhile.


def living(pids: list[int]) -> list[int]:
    """Those of `pids` still running (a zombie has exited)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


async def first_words(caller: RtcCaller, n: int) -> str:
    """The id of the caller's n-th response once some of its text has arrived."""
    created = await caller.wait_for("response.created", count=n, timeout=120)
    response_id = created["response"]["id"]
    await wait_until(lambda: transcript_of(caller, response_id), 120, f"reply {n}'s first words")
    return response_id


def heard_transcript(done: dict[str, Any]) -> str:
    return done["response"]["output"][0]["content"][0]["transcript"]


@pytest.mark.engines
async def test_completed_turns_survive_kill_9_of_the_api_process(
    tiny_models_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    data = tmp_path / "records"  # made by the server
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [str(OMNIVOX), "serve", "--profile", "tiny", "--port", str(port),
             "--models-dir", str(tiny_models_dir), "--data-dir", str(data),
             "--log-level", "warning"],
            stdout=log_file, stderr=subprocess.STDOUT,
        )
    family: list[int] = []
    caller: RtcCaller | None = None
    passed = False
    try:
        await asyncio.to_thread(
            wait_for, lambda: (r := get(f"{base}/readyz")) and r.status_code == 200, 300,
            "/readyz 200")
        children = psutil.Process(process.pid).children(recursive=True)
        titles = {" ".join(p.cmdline()).strip() for p in children}
        assert {"omnivox-thinker", "omnivox-talker", "omnivox-voicebox"} <= titles, titles
        family = [p.pid for p in children]
        caller = await connect(base)
        call_id = call_id_of(caller)

        say(caller, "Hello, who is this?")
        completed = await caller.wait_for("response.done", timeout=120)
        assert completed["response"]["status"] == "completed", completed
        long_replies(caller)
        await caller.wait_for("session.updated")
        say(caller, "Tell me a long story.")
        await first_words(caller, 2)
        caller.send({"type": "response.cancel"})
        cancelled = await caller.wait_for("response.done", count=2, timeout=60)
        assert cancelled["response"]["status"] == "cancelled", cancelled
        # The API has both (this GET queues behind their writes)...
        listed = (await get_record(base, call_id)).json()
        assert [t["status"] for t in listed["turns"]] == ["completed", "cancelled"]

        # ...and a third turn is mid-reply when the API process is killed.
        say(caller, "And another one.")
        in_flight = await first_words(caller, 3)
        os.kill(process.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        assert await asyncio.to_thread(process.wait, 30) == -signal.SIGKILL
        await asyncio.to_thread(wait_for, lambda: not living(family), 30,
                                "every stage worker and engine process to die with the API")
        print(f"\n[records] kill -9 to no process left: {time.monotonic() - killed_at:.1f} s")
        passed = True
    finally:
        if caller is not None:
            await caller.close()
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in living(family):  # only after a failure: never leave engines behind
            psutil.Process(pid).kill()
        if not passed:
            print(log_path.read_text()[-4000:])

    with sqlite3.connect(data / DB_NAME) as db:
        db.row_factory = sqlite3.Row
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        call = db.execute("SELECT * FROM calls WHERE call_id = ?", (call_id,)).fetchone()
        turns = db.execute("SELECT * FROM turns WHERE call_id = ? ORDER BY started_at",
                           (call_id,)).fetchall()
    assert call is not None and call["profile"] == "tiny"
    assert call["ended_at"] is None  # the server died before the call ended
    assert [t["response_id"] for t in turns] == [
        completed["response"]["id"], cancelled["response"]["id"]]
    assert in_flight not in {t["response_id"] for t in turns}  # never completed: never written
    first, second = turns
    assert first["status"] == "completed"
    assert first["user_transcript"] == "Hello, who is this?"
    assert first["agent_transcript"] == heard_transcript(completed) != ""
    assert (second["status"], second["reason"]) == ("cancelled", "client_cancelled")
    assert second["user_transcript"] == "Tell me a long story."
    assert second["agent_transcript"] == heard_transcript(cancelled)


# -- real calls on the tiny family, in process ----------------------------------------------


@pytest.mark.engines
async def test_completed_and_cancelled_turns_are_recorded(tiny_server: Served) -> None:
    caller = await connect(tiny_server.url)
    call_id = call_id_of(caller)
    try:
        question = "What is the capital of France?"
        say(caller, question)
        user_item = (await caller.wait_for("conversation.item.created"))["item"]
        done = await caller.wait_for("response.done", timeout=120)
        transcript = (await caller.wait_for("response.output_audio_transcript.done"))["transcript"]
        assert done["response"]["status"] == "completed", done

        # response.done went out after the turn was queued: this GET (queued behind it) finds it.
        reply = await get_record(tiny_server.url, call_id)
        assert reply.status_code == 200, reply.text
        record = reply.json()
        assert (record["id"], record["profile"], record["ended_at"]) == (call_id, "tiny", None)
        (turn,) = record["turns"]
        assert turn["status"] == "completed" and turn["reason"] is turn["error"] is None
        assert (turn["response_id"], turn["item_id"]) == (
            done["response"]["id"], done["response"]["output"][0]["id"])
        assert (turn["user_item_id"], turn["user_transcript"]) == (user_item["id"], question)
        assert turn["agent_transcript"] == transcript != ""
        assert turn["turn_id"].startswith(call_id)
        assert record["started_at"] <= turn["started_at"] <= turn["ended_at"]
        assert 0 < turn["first_audio_ms"] <= (turn["ended_at"] - turn["started_at"]) * 1000
        assert turn["audio_ms"] > 0
        details = done["response"]["usage"]["output_token_details"]
        assert turn["usage"]["thinker_tokens"] == details["text_tokens"] > 0

        # The same row, read from the file as anyone would (WAL: readers never wait on writes).
        with sqlite3.connect(tiny_server.app.state.records.path) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            row = db.execute("SELECT status, agent_transcript FROM turns WHERE response_id = ?",
                             (turn["response_id"],)).fetchone()
        assert row == ("completed", transcript)

        # A reply cancelled by the client mid-generation is recorded as cancelled, with the
        # text the caller heard of it.
        long_replies(caller)
        await caller.wait_for("session.updated")
        say(caller, "Tell me a long story.")
        response_id = await first_words(caller, 2)
        caller.send({"type": "response.cancel"})
        cancelled = await caller.wait_for("response.done", count=2, timeout=60)
        assert cancelled["response"]["status"] == "cancelled"
        turns = (await get_record(tiny_server.url, call_id)).json()["turns"]
        assert [t["response_id"] for t in turns] == [done["response"]["id"], response_id]
        cut = turns[1]
        assert (cut["status"], cut["reason"]) == ("cancelled", "client_cancelled")
        assert cut["agent_transcript"] == heard_transcript(cancelled)
        assert cut["user_transcript"] == "Tell me a long story."
        assert cut["cut_ms"] is not None
    finally:
        await caller.hang_up()
    ended = (await get_record(tiny_server.url, call_id)).json()
    assert ended["end_reason"] == "hangup" and ended["ended_at"] >= ended["started_at"]
    assert len(ended["turns"]) == 2
