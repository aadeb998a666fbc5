"""The fake family with a Thinker that can keep its event loop busy, as a loaded worker does.

A Thinker message "BUSY <steps>" makes the job spend `STEP_CPU_S` of CPU on the event loop per
step, yielding to the loop (and its heartbeats) between steps: given the CPU, the worker beats
on; starved of it, each step takes so long that its heartbeats stop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from pipeline.stage import ThinkerJob, ThinkerOutput
from tests.fake_family import FakeTalker, FakeThinker, FakeVoiceBox

STEP_CPU_S = 0.1


def spin(cpu_s: float) -> None:
    """Use `cpu_s` of this thread's CPU time (wall time depends on what the CPU is shared with)."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


class BusyThinker(FakeThinker):
    async def stream(self, job: ThinkerJob) -> AsyncIterator[ThinkerOutput]:
        words = job.messages[-1]["content"].split()
        if words[:1] != ["BUSY"]:
            async for output in super().stream(job):
                yield output
            return
        for step in range(int(words[1])):
            spin(STEP_CPU_S)  # on the event loop, on purpose
            yield ThinkerOutput(job.request_id, text=f" {step}", token_ids=[step])
            await asyncio.sleep(0)
        yield ThinkerOutput(job.request_id, finished=True, finish_reason="length")


STAGES: dict[str, Any] = {"thinker": BusyThinker, "talker": FakeTalker, "voicebox": FakeVoiceBox}
