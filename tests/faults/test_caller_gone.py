"""A caller who vanishes mid-reply (its peer connection closed, no DELETE) ends the call and
every request of its turn (on the package's fault server, tests/faults/conftest.py)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable

import pytest

from tests.cpu_wait import CpuWait
from tests.faults.fault_server import FaultServer
from tests.product_calls import connect, engines_hold, long_replies, say, session_of, wait_until

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]

HANG_GUARD_S = 60.0  # only keeps a broken test from hanging: the checks are on what it measured


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.2)


async def test_caller_who_vanishes_mid_reply_ends_the_call_and_its_requests(
    fault_server: FaultServer,
) -> None:
    """The caller closes its peer connection (no DELETE) while a long reply is generating: the
    call ends within a second of CPU-available time (the wall time less what this process,
    which serves the call, waited for a CPU), its record says `connection_closed` with the
    reply cancelled by the call's end, and by the time that record is written (after the
    session's cancel of the turn returned: the workers acknowledged the aborts) the engines
    hold nothing of the turn."""
    served, pipeline = fault_server.served, fault_server.pipeline
    caller = await connect(served.url)
    try:
        long_replies(caller)
        say(caller, "Tell me a very long story.")
        await caller.wait_for("output_audio_buffer.started", timeout=60)
        session = session_of(served, caller)
        call_id, reply = session.call.id, session.reply
        assert reply is not None, "the reply is still generating"
        run = pipeline._runs[reply.turn_id]
        assert await engines_hold(served, reply.turn_id), "the engines are working on the turn"
    finally:
        cpu = CpuWait(os.getpid())  # the API process: the server (and the caller) run here
        await caller.close()  # the peer connection only: the server is not told
    await wait_until(lambda: served.app.state.calls.get(call_id) is None, HANG_GUARD_S,
                     "the server to notice the caller is gone and end the call")
    noticed, waited = cpu.elapsed(), cpu.waited()
    assert noticed - waited < 1.0, (
        f"the call ended {noticed:.2f} s after the caller closed, of which the API process "
        f"waited {waited:.2f} s for a CPU: more than a second of CPU-available time")
    assert run.cancelled, "the turn was aborted, not left to run to its end"

    records = served.app.state.records

    async def ended() -> bool:
        record = await records.call_record(call_id)
        return record is not None and record["ended_at"] is not None

    await eventually(ended, HANG_GUARD_S, "the call's record to say it ended")
    record = await records.call_record(call_id)
    assert record["end_reason"] == "connection_closed", record
    cut = [t for t in record["turns"] if t["response_id"] == reply.response_id]
    assert [(t["status"], t["reason"]) for t in cut] == [("cancelled", "call_ended")], record
    # No polling: the record is written after the session's cancel returned, which waits for
    # every stage worker to acknowledge its aborts.
    assert await engines_hold(served, reply.turn_id) == []
    print(f"\ncaller gone mid-reply: call ended {noticed:.2f} s after the caller closed "
          f"(the API process waited {waited:.2f} s of it for a CPU); recorded as "
          f"{record['end_reason']} {record['ended_at'] - record['started_at']:.1f} s into the "
          f"call, and the engines hold nothing of its turn")
