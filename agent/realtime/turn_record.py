"""A finished reply as the call records keep it: the protocol's reply and conversation turned
into the plain `TurnRecord` the store writes (agent/ops/records.py never sees protocol types)."""

from __future__ import annotations

import asyncio
import json
import time

from agent.ops.records import TurnRecord
from agent.realtime.history import Conversation, Item
from agent.realtime.reply import Reply


def turn_record(
    call_id: str,
    reply: Reply,
    conversation: Conversation,
    status: str,
    transcript: str,
    *,
    error: str | None = None,
    reason: str | None = None,
) -> TurnRecord:
    """The record of `reply` ending now (call on the event loop: its times are loop times)."""
    loop_now, wall_now = asyncio.get_running_loop().time(), time.time()

    user_text, user_item_id = _user_part(conversation, reply)
    return TurnRecord(
        call_id=call_id,
        turn_id=reply.turn_id,
        response_id=reply.response_id,
        item_id=reply.item_id,
        user_item_id=user_item_id,
        user_transcript=user_text,
        agent_transcript=transcript,
        status=status,
        reason=reason,
        error=error,
        started_at=wall_now - (loop_now - reply.started_at),
        first_audio_ms=after_start_ms(reply, reply.first_audio_at),
        first_frame_ms=after_start_ms(reply, reply.first_frame_at),
        ended_at=wall_now,
        audio_ms=reply.spoken.total_ms,
        cut_ms=reply.cut_ms,
        underruns=reply.underruns,
        usage=json.dumps(reply.usage, default=str) if reply.usage is not None else None,
    )


def after_start_ms(reply: Reply, at: float | None) -> float | None:
    """A loop time of `reply` as ms after it started, as its record keeps it."""
    return None if at is None else round((at - reply.started_at) * 1000, 1)


def _user_part(conversation: Conversation, reply: Reply) -> tuple[str | None, str | None]:
    """What the caller said that the reply answered: the user items (typed or spoken) since the
    previous assistant item, and the id of the last one."""
    items = conversation.items
    end = next((i for i, item in enumerate(items) if item.item_id == reply.item_id), None)
    users: list[Item] = []
    for item in reversed(items[:end] if end is not None else []):
        if item.role != "user":
            break
        users.insert(0, item)
    text = " ".join(item.text for item in users if item.text) or None
    last_id = reply.user_item_id or (users[-1].item_id if users else None)
    return text, last_id
