"""Log records: one JSON object per line or readable text, each carrying the call and turn it
was emitted for; the ids follow the asyncio tasks a call and its replies start, through a real
call on the tiny family; the command line picks the format (--log-format, OMNIVOX_LOG_FORMAT)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.ops import logs
from tests.product_calls import connect, say, wait_until
from tests.served import Served

OMNIVOX = Path(sys.executable).with_name("omnivox")
SERVER_LOGGERS = ("agent.", "media.", "pipeline.", "aiortc", "uvicorn")
TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) +(?P<logger>[\w.]+)"
    r"(?: \[(?P<ids>[^\]]+)\])?: (?P<message>.*)$")


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO, io.StringIO]]:
    """A logger writing both formats into buffers: (logger, json lines, text lines)."""
    logger = logging.getLogger("omnivox.test_logs")
    as_json, as_text = io.StringIO(), io.StringIO()
    handlers = [logs.handler("json", as_json), logs.handler("text", as_text)]
    for handler in handlers:
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield logger, as_json, as_text
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


def json_lines(buffer: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_json_is_one_object_per_line_with_the_ids(captured) -> None:
    logger, as_json, _ = captured
    logger.info("outside any call")
    with logs.context(call_id="rtc_a", turn_id="rtc_a-turn1"):
        logger.warning("two\nlines, and \"quotes\"")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("it broke")
    lines = as_json.getvalue().splitlines()
    assert len(lines) == 3  # the newline and the traceback stay inside their objects
    outside, warned, broke = (json.loads(line) for line in lines)
    assert outside["call_id"] is None and outside["turn_id"] is None
    assert outside["message"] == "outside any call" and outside["level"] == "INFO"
    assert outside["logger"] == "omnivox.test_logs" and outside["ts"].endswith("+00:00")
    assert warned["message"] == "two\nlines, and \"quotes\"" and warned["level"] == "WARNING"
    assert (warned["call_id"], warned["turn_id"]) == ("rtc_a", "rtc_a-turn1")
    assert "ValueError: boom" in broke["exc"] and broke["call_id"] == "rtc_a"


def test_text_is_readable_and_names_call_and_turn(captured) -> None:
    logger, _, as_text = captured
    logger.info("no call")
    with logs.context(call_id="rtc_a"):
        logger.info("in the call")
        with logs.context(turn_id="rtc_a-turn2"):
            logger.info("in its turn")
    with logs.context(turn_id="bench-7"):
        logger.info("a turn of no call")
    parsed = [TEXT_LINE.match(line) for line in as_text.getvalue().splitlines()]
    assert all(parsed), as_text.getvalue()
    assert [(m["level"], m["logger"], m["ids"], m["message"]) for m in parsed] == [
        ("INFO", "omnivox.test_logs", None, "no call"),
        ("INFO", "omnivox.test_logs", "rtc_a", "in the call"),
        ("INFO", "omnivox.test_logs", "rtc_a/turn2", "in its turn"),
        ("INFO", "omnivox.test_logs", "-/bench-7", "a turn of no call"),
    ]


async def test_ids_follow_the_tasks_started_inside_a_context(captured) -> None:
    logger, as_json, _ = captured

    async def work(what: str) -> None:
        await asyncio.sleep(0.01)  # log after the starter has left its context
        logger.info(what)

    tasks = []
    for call in ("rtc_a", "rtc_b"):
        with logs.context(call_id=call, turn_id=f"{call}-turn1"):
            tasks.append(asyncio.ensure_future(work(f"from {call}")))
    tasks.append(asyncio.ensure_future(work("from no call")))
    await asyncio.gather(*tasks)
    seen = {line["message"]: (line["call_id"], line["turn_id"]) for line in json_lines(as_json)}
    assert seen == {"from rtc_a": ("rtc_a", "rtc_a-turn1"), "from rtc_b": ("rtc_b", "rtc_b-turn1"),
                    "from no call": (None, None)}


@pytest.mark.parametrize("log_format", ["json", "text", "xml"])
def test_the_command_line_writes_the_chosen_format(tmp_path: Path, log_format: str) -> None:
    """`omnivox models build tiny` logs one record when it is done: in the format asked for."""
    env = {**os.environ, "OMNIVOX_LOG_FORMAT": log_format}
    done = subprocess.run([str(OMNIVOX), "models", "build", "tiny", "--models-dir", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    if log_format == "xml":
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1, done.stderr  # one line, no traceback
        assert "OMNIVOX_LOG_FORMAT" in done.stderr and "xml" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    record = [line for line in done.stderr.splitlines() if "built tiny family" in line]
    assert len(record) == 1, done.stderr
    if log_format == "json":
        entry = json.loads(record[0])
        assert entry["logger"] == "pipeline.families.kit.build_support" and entry["level"] == "INFO"
        assert entry["call_id"] is None
    else:
        match = TEXT_LINE.match(record[0])
        assert match and match["logger"] == "pipeline.families.kit.build_support", record[0]


@pytest.mark.engines
async def test_a_calls_records_carry_its_call_and_turn(tiny_server: Served) -> None:
    """Everything logged for a real call, from the offer to the hang-up (another request),
    carries the call's id; its reply's records carry the turn's id too."""
    as_json, as_text = io.StringIO(), io.StringIO()
    handlers = [logs.handler("json", as_json), logs.handler("text", as_text)]
    root = logging.getLogger()
    for handler in handlers:
        root.addHandler(handler)
    try:
        caller = await connect(tiny_server.url)
        call_id = caller.location.rsplit("/", 1)[1]
        try:
            say(caller, "Hello, who are you?")
            done = await caller.wait_for("response.done", timeout=90)
            assert done["response"]["status"] == "completed", done
        finally:
            await caller.hang_up()  # a DELETE: a request of its own
        await wait_until(lambda: len(tiny_server.app.state.calls) == 0, 10, "the hang-up")
    finally:
        for handler in handlers:
            root.removeHandler(handler)
    # The server's records (the test's own http client logs the call's URL too).
    records = [r for r in json_lines(as_json) if r["logger"].startswith(SERVER_LOGGERS)]
    about_call = [r for r in records if call_id in r["message"]]
    messages = [r["message"] for r in about_call]
    assert any("started" in m for m in messages) and any("ended" in m for m in messages), messages
    assert all(r["call_id"] == call_id for r in about_call), about_call
    # The call's own objects log only inside it (media's records name no call themselves).
    own = ("agent.calls.call", "agent.realtime.session", "agent.realtime.reply_events",
           "agent.realtime.turn_taking", "media.")
    assert all(r["call_id"] == call_id for r in records if r["logger"].startswith(own)), records
    turn_id = f"{call_id}-turn1"
    first_audio = [r for r in about_call if "first audio" in r["message"]]
    assert len(first_audio) == 1 and first_audio[0]["turn_id"] == turn_id, about_call
    # No record of this call is tagged with another call, and turns sit inside their call.
    assert all(r["call_id"] == call_id for r in records if r["turn_id"] == turn_id)
    text = as_text.getvalue()
    assert f"[{call_id}/turn1]: call {call_id}: first audio" in text, text
