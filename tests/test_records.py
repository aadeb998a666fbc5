"""Call records: each call and each of its turns lands in SQLite (WAL) as it completes, survives
kill -9 of the API process, and `GET /v1/calls/{call_id}` returns it.

Exercised through media-only calls, through real calls on the tiny family (completed and
cancelled turns), and through `omnivox serve` killed with SIGKILL mid-reply; the store on its
own is tests/test_records_store.py."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent.ops.records import DB_NAME
from tests.product_calls import (
    call_id_of,
    connect,
    get_record,
    long_replies,
    say,
    transcript_of,
    wait_until,
)
from tests.rtc_client import RtcCaller
from tests.served import Served
from tests.test_serve_process import OMNIVOX, free_port, get, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


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
        user_item = (await caller.wait_for("conversation.item.added"))["item"]
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
