"""The rows the Talker reads, per request, computed in the Thinker worker's torch thread.

A request's prompt rows are computed while vLLM prefills the same prompt; its reply rows, as
each delta's tokens arrive. Concurrent requests' reply steps go through one `BatchedSteps`:
the steps queued while the torch thread is busy run as one batched forward when it frees
(`thinker_states.step_many`, through `batched_work.BatchedWork`), so many calls read the LM's
weights once a step instead of once each, and a lone call waits for nothing.
"""

from __future__ import annotations

import asyncio

import torch

from pipeline.families.kit.batched_work import BatchedWork
from pipeline.families.kit.work_thread import WorkThread
from pipeline.families.qwen25_omni.thinker_prompt import ThinkerPrompt
from pipeline.families.qwen25_omni.thinker_states import ReplyStates, ThinkerStates, step_many

BatchedSteps = BatchedWork[tuple[ReplyStates, list[int]], torch.Tensor]

MAX_BATCH = 64  # requests a batched step takes at most (the rest wait for the next)


def batched_steps(thread: WorkThread) -> BatchedSteps:
    """Reply steps of concurrent requests, batched in the torch thread as they queue up."""
    return BatchedWork(thread, step_many, MAX_BATCH)


class TalkerRows:
    """One request's rows for the Talker: the prompt part first, then each delta's rows."""

    def __init__(self, steps: BatchedSteps, states: ThinkerStates, prompt: ThinkerPrompt):
        self.steps = steps
        # The prompt's hidden states are computed while vLLM prefills the same prompt.
        self.opened = asyncio.ensure_future(steps.thread.run(states.open, prompt))
        self.prompt_sent = False

    async def next(self, token_ids: list[int]) -> tuple[int, torch.Tensor]:
        """These reply tokens' rows, after the prompt rows the first time; and how many
        leading rows are the prompt's (the prompt's length the first time, 0 after)."""
        reply, prompt_rows = await self.opened
        rows = await self.steps.run((reply, token_ids))
        if self.prompt_sent:
            return 0, rows
        self.prompt_sent = True
        return len(prompt_rows), torch.cat([prompt_rows, rows])

    def close(self) -> None:
        """Drop the prompt's computation if nobody waited for it (the request ended early)."""
        if not self.opened.done():
            self.opened.cancel()
