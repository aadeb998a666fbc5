"""A reply whose Thinker answered in the function-calling JSON (function_calls.py), read once
whole: a call becomes the reply's function_call item, words are voiced by a follow-up turn that
recites them, and an answer cut off by the length bound ends the reply incomplete."""

from __future__ import annotations

from typing import Any, Protocol

from agent.config import ConversationSettings
from agent.guided.functions import FunctionCall, call_text, read_answer
from agent.realtime.history import Conversation
from agent.realtime.reply import Reply
from agent.realtime.server_events import (
    conversation_item_added,
    function_call_arguments_delta,
    function_call_arguments_done,
    function_call_item,
    new_id,
    output_item_added,
    usage_object,
)
from agent.realtime.transport import CallTransport
from pipeline.turns.events import Turn, TurnDone


class Replying(Protocol):
    """What a reply's answer needs of the session it runs in: the call the events go to, the
    history they join, the settings a follow-up turn speaks with, and the reply's message item
    announced or the reply closed."""

    @property
    def call(self) -> CallTransport: ...

    @property
    def conversation(self) -> Conversation: ...

    @property
    def settings(self) -> ConversationSettings: ...

    def announce(self, reply: Reply) -> None: ...

    def finish(self, reply: Reply, status: str, usage: dict[str, Any] | None = None,
               error: str | None = None, reason: str | None = None,
               text: str | None = None) -> None: ...


def answered(session: Replying, reply: Reply, done: TurnDone) -> None:
    """Act on the whole answer of `reply`'s JSON turn."""
    answer = read_answer(done.text)
    reply.answers_in_json, reply.usage = False, done.usage
    if answer.calls:
        announce_call(session, reply, answer.calls[0])
        session.finish(reply, "completed", usage=usage_object(done.usage))
    elif answer.whole and answer.content is not None:
        reply.text = ""
        session.announce(reply)
        reply.follow_up = Turn(turn_id=reply.turn_id, call_id=session.call.id, messages=[],
                               recite=answer.content, voice=session.settings.voice,
                               max_tokens=session.settings.max_reply_tokens,
                               speak=not reply.text_only)
    else:
        session.finish(reply, "incomplete", usage=usage_object(done.usage),
                       reason="max_output_tokens", text="")


def announce_call(session: Replying, reply: Reply, call: FunctionCall) -> None:
    """The call joins the history and goes to the client: the item, then its arguments (one
    delta, whole: they are only known valid once the JSON closes)."""
    reply.call, reply.call_item_id = call, new_id("item")
    item_id, response_id = reply.call_item_id, reply.response_id
    session.conversation.add(item_id, "assistant", call_text(call.name, call.arguments),
                             call_id=call.call_id)
    item = function_call_item(item_id, call.call_id, call.name, "", "in_progress")
    for event in (output_item_added(response_id, item), conversation_item_added(item),
                  function_call_arguments_delta(response_id, item_id, call.call_id,
                                                call.arguments),
                  function_call_arguments_done(response_id, item_id, call.call_id, call.name,
                                               call.arguments)):
        session.call.send_event(event)


def merged_usage(before: dict[str, object] | None, after: dict[str, object]) -> dict[str, object]:
    """A voiced answer's usage: the follow-up turn's, with the text tokens the Thinker
    generated for the JSON answer (the recited ones are not generated)."""
    if before is None:
        return after
    return {**after, "thinker_tokens": before.get("thinker_tokens", 0)}
