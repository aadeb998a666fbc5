"""The conversation's items as OpenAI's GA protocol has them, on the tiny family's real
engines: a typed item starts no response by itself (only response.create does), each item is
added then done, and a client reads (`conversation.item.retrieve`) and edits
(`conversation.item.delete`) the history the Thinker's next turn is given, and the session's
`truncation` says what of a history too long for the Thinker's window it keeps."""

from __future__ import annotations

import pytest

from tests.product_calls import (
    assert_valid_events,
    record_turns,
    session_of,
    transcript_of,
    type_text,
    update_session,
    wait_until,
)
from tests.rtc_client import RtcCaller
from tests.served import Served

pytestmark = [pytest.mark.engines]


async def test_typed_items_wait_for_response_create(
    tiny_server: Served, caller: RtcCaller
) -> None:
    session = session_of(tiny_server, caller)
    turns = record_turns(session)
    type_text(caller, "My name is Ada.")
    type_text(caller, "What is my name?")
    await caller.wait_for("conversation.item.added", count=2)
    # Events go out in order: a reply the first item started would be announced by now.
    assert not caller.of_type("response.created")
    assert session.reply is None
    caller.send({"type": "response.create"})
    done = await caller.wait_for("response.done", timeout=60)
    assert done["response"]["status"] == "completed", done
    (turn,) = turns
    users = [m["content"] for m in turn.messages if m["role"] == "user"]
    assert users == ["My name is Ada.", "What is my name?"]
    await wait_until(lambda: session.reply is None, 30, "the reply to end")
    assert_valid_events(caller)


async def test_a_client_reads_and_edits_the_history_the_thinker_is_given(
    tiny_server: Served, caller: RtcCaller
) -> None:
    session = session_of(tiny_server, caller)
    turns = record_turns(session)
    type_text(caller, "Forget this one.")
    type_text(caller, "Keep this one.")
    await caller.wait_for("conversation.item.added", count=2)
    await caller.wait_for("conversation.item.done", count=2)
    first, second = (e["item"]["id"] for e in caller.of_type("conversation.item.added"))
    assert [e["item"]["id"] for e in caller.of_type("conversation.item.done")] == [first, second]

    caller.send({"type": "conversation.item.retrieve", "item_id": first})
    retrieved = (await caller.wait_for("conversation.item.retrieved"))["item"]
    assert retrieved["content"] == [{"type": "input_text", "text": "Forget this one."}]
    caller.send({"type": "conversation.item.delete", "item_id": first})
    assert (await caller.wait_for("conversation.item.deleted"))["item_id"] == first
    for kind in ("retrieve", "delete"):
        caller.send({"type": f"conversation.item.{kind}", "event_id": f"evt_{kind}",
                     "item_id": first})
    await caller.wait_for("error", count=2)
    errors = [(e["error"]["event_id"], e["error"]["code"]) for e in caller.of_type("error")]
    assert errors == [("evt_retrieve", "item_not_found"), ("evt_delete", "item_not_found")]

    caller.send({"type": "response.create"})
    done = (await caller.wait_for("response.done", timeout=60))["response"]
    assert done["status"] == "completed", done
    users = [m["content"] for m in turns[0].messages if m["role"] == "user"]
    assert users == ["Keep this one."]  # the deleted item is gone from the Thinker's prompt
    reply_id = done["output"][0]["id"]
    caller.send({"type": "conversation.item.retrieve", "item_id": reply_id})
    reply = (await caller.wait_for("conversation.item.retrieved", count=2))["item"]
    assert reply["status"] == "completed" and reply["role"] == "assistant"
    assert reply["content"][0]["transcript"] == transcript_of(caller, done["id"])
    assert_valid_events(caller)


def numbers(seed: int) -> str:
    """A typed message of many tokens (digits and spaces: no word the tokenizer merges)."""
    return " ".join(str((seed * 97 + j * 31) % 1000) for j in range(80))


async def test_truncation_decides_what_of_a_long_history_the_thinker_keeps(
    tiny_server: Served, caller: RtcCaller
) -> None:
    """A history far past the tiny Thinker's window (1,024 tokens): `disabled` fails the turn,
    a retention ratio of 0.5 keeps at most half the room, `auto` keeps more (steps of 128)."""
    update_session(caller, instructions="", max_output_tokens=16, truncation="disabled")
    updated = (await caller.wait_for("session.updated"))["session"]
    assert updated["truncation"] == "disabled"
    for i in range(24):
        type_text(caller, numbers(i))
    await caller.wait_for("conversation.item.added", count=24)

    caller.send({"type": "response.create"})
    failed = (await caller.wait_for("response.done", timeout=60))["response"]
    assert failed["status"] == "failed", failed
    assert "max_model_len 1024" in failed["status_details"]["error"]["message"], failed

    prompts = []
    for count, truncation in enumerate(
            ({"type": "retention_ratio", "retention_ratio": 0.5}, "auto"), start=2):
        update_session(caller, truncation=truncation)
        updated = (await caller.wait_for("session.updated", count=count))["session"]
        assert updated["truncation"] == truncation
        caller.send({"type": "response.create"})
        done = (await caller.wait_for("response.done", count=count, timeout=60))["response"]
        assert done["status"] == "completed", done
        prompts.append(done["usage"]["input_tokens"])
    kept_half, kept_auto = prompts
    assert 0 < kept_half <= (1024 - 16) // 2 < kept_auto <= 1024 - 16, prompts
    assert_valid_events(caller)
