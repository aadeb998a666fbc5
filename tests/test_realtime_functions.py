"""Function calling in a live call, the Realtime way, on the tiny family (random weights): the
session declares tools, the agent's function_call arguments are valid for the tool's schema
(generated under its grammar), and after the client's function_call_output the agent speaks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import jsonschema
import pytest

from agent.app import create_app
from agent.config import Settings
from agent.guided.functions import call_text
from pipeline.turns.orchestrator import Pipeline
from tests.fake_family import FAKE_PIPELINE
from tests.product_calls import (
    assert_valid_events,
    connect,
    engines_hold,
    record_turns,
    say,
    session_of,
    transcript_of,
    update_session,
    wait_until,
)
from tests.rtc_client import RtcCaller
from tests.served import Served, serve

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                          "unit": {"enum": ["C", "F"]}}}
BOOKING = {"type": "object", "additionalProperties": False, "required": ["people", "time"],
           "properties": {"people": {"type": "integer", "minimum": 1, "maximum": 12},
                          "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}}}
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city now",
          "parameters": WEATHER},
         {"type": "function", "name": "book_table", "parameters": BOOKING}]
PARAMETERS = {"get_weather": WEATHER, "book_table": BOOKING}


async def test_the_agent_calls_a_tool_then_speaks_its_result(
    tiny_server: Served, caller: RtcCaller
) -> None:
    session = session_of(tiny_server, caller)
    turns = record_turns(session)
    update_session(caller, tools=TOOLS, tool_choice="required", max_output_tokens=200)
    updated = (await caller.wait_for("session.updated"))["session"]
    assert [t["name"] for t in updated["tools"]] == ["get_weather", "book_table"]
    assert updated["tool_choice"] == "required"

    say(caller, "What is the weather like in Paris?")
    done = (await caller.wait_for("response.done", timeout=120))["response"]
    assert done["status"] == "completed", done
    (item,) = done["output"]
    assert item["type"] == "function_call" and item["name"] in PARAMETERS, item
    jsonschema.validate(json.loads(item["arguments"]), PARAMETERS[item["name"]])
    deltas = [e["delta"] for e in caller.of_type("response.function_call_arguments.delta")]
    (args_done,) = caller.of_type("response.function_call_arguments.done")
    assert "".join(deltas) == args_done["arguments"] == item["arguments"]
    assert (args_done["call_id"], args_done["item_id"]) == (item["call_id"], item["id"])
    # A call is not spoken: no audio, no transcript, and the engines hold nothing of it.
    assert not caller.of_type("output_audio_buffer.started")
    assert not caller.of_type("response.output_audio_transcript.delta")
    assert await engines_hold(tiny_server, turns[0].turn_id) == []
    # The Thinker answered under the tools' grammar, told of them in a system message.
    assert turns[0].response_format is not None and not turns[0].speak
    assert any("get_weather" in m["content"] for m in turns[0].messages if m["role"] == "system")

    caller.send({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": item["call_id"], "output": '{"temp": 21}'}})
    created = (await caller.wait_for("conversation.item.added", count=3))["item"]
    assert (created["type"], created["call_id"]) == ("function_call_output", item["call_id"])
    update_session(caller, max_output_tokens=16)  # a short spoken reply is enough
    await caller.wait_for("session.updated", count=2)
    caller.send({"type": "response.create", "response": {"tool_choice": "none"}})
    spoken = (await caller.wait_for("response.done", count=2, timeout=120))["response"]
    assert spoken["status"] == "completed", spoken
    assert spoken["output"][0]["type"] == "message"
    assert transcript_of(caller, spoken["id"]).strip()
    await caller.wait_for("output_audio_buffer.started", timeout=60)
    # The reply was written knowing the call and its result; the session's tools still stand.
    history = turns[1].messages
    assert {"role": "assistant", "content": call_text(item["name"], item["arguments"])} in history
    assert {"role": "tool", "content": '{"temp": 21}'} in history
    assert turns[1].response_format is None and turns[1].speak
    assert session.tools.choice == "required"
    assert_valid_events(caller)


BAD_TOOLS = [
    ({"tools": [{"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:1"}]},
     "only function tools"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "maxLength": 3}}}}]},
     "tools[0].parameters.properties.q.maxLength"),
    ({"tools": [{"type": "function", "name": "no spaces"}]}, "tools[0].name"),
    ({"tools": TOOLS[:1], "tool_choice": {"type": "function", "name": "book_table"}},
     "'book_table', which is not among the tools"),
]


async def test_tools_the_server_cannot_honour_are_refused_and_change_nothing(
    tiny_server: Served, caller: RtcCaller
) -> None:
    session = session_of(tiny_server, caller)
    for index, (fields, message) in enumerate(BAD_TOOLS):
        caller.send({"type": "session.update", "event_id": f"evt_{index}",
                     "session": {"type": "realtime", "instructions": "Not applied.", **fields}})
        error = (await caller.wait_for("error", count=index + 1))["error"]
        assert error["code"] == "invalid_value" and message in error["message"], error
        assert error["event_id"] == f"evt_{index}"
    assert session.tools.functions == () and session.settings.instructions != "Not applied."

    # An output for a call the conversation never had is refused; nothing joins the history.
    caller.send({"type": "conversation.item.create", "event_id": "evt_out", "item": {
        "type": "function_call_output", "call_id": "call_nope", "output": "{}"}})
    error = (await caller.wait_for("error", count=len(BAD_TOOLS) + 1))["error"]
    assert (error["code"], error["event_id"]) == ("item_not_found", "evt_out")
    assert session.conversation.items == []
    assert not caller.of_type("session.updated") and not caller.of_type("response.created")
    assert_valid_events(caller)


async def test_required_before_any_tool_stands_and_words_answer_meanwhile(
    tiny_server: Served, caller: RtcCaller
) -> None:
    """LiveKit's and pipecat's first session.update names tool_choice before their tools
    come: it is taken, and until a tool exists a response answers in words."""
    session = session_of(tiny_server, caller)
    turns = record_turns(session)
    update_session(caller, tool_choice="required", max_output_tokens=8)
    updated = (await caller.wait_for("session.updated"))["session"]
    assert (updated["tool_choice"], updated["tools"]) == ("required", [])
    caller.send({"type": "response.create", "response": {"metadata": {"client_event_id": "a1"}}})
    created = (await caller.wait_for("response.created"))["response"]
    done = (await caller.wait_for("response.done", timeout=60))["response"]
    assert created["metadata"] == done["metadata"] == {"client_event_id": "a1"}  # given back
    assert done["status"] == "completed" and done["output"][0]["type"] == "message", done
    assert turns[0].response_format is None  # no grammar: words
    update_session(caller, tools=TOOLS[:1])
    await caller.wait_for("session.updated", count=2)
    assert session.tools.choice == "required" and session.tools.functions
    assert_valid_events(caller)


@pytest.fixture(scope="module")
async def fake_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """Sessions on the fake family, whose Thinker answers a guided job with the JSON its last
    message scripts after "JSON:": the answer is chosen by the test, not by random weights
    (whose words, under tool_choice auto, never end within a reply's tokens)."""
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("data")),
                     pipeline=Pipeline(FAKE_PIPELINE))
    async with serve(app) as served:
        await wait_until(lambda: app.state.readiness.ready(), 120, "the fake stages")
        yield served


async def test_an_answer_in_words_is_voiced_and_a_cut_one_is_incomplete(
    fake_server: Served,
) -> None:
    caller = await connect(fake_server.url)
    session = session_of(fake_server, caller)
    turns = record_turns(session)
    try:
        update_session(caller, tools=TOOLS)  # tool_choice auto: a call, or words
        await caller.wait_for("session.updated")
        say(caller, 'JSON:{"content": "It is sunny in Paris today."}')
        done = (await caller.wait_for("response.done", timeout=30))["response"]
        assert done["status"] == "completed", done
        (item,) = done["output"]
        assert item["type"] == "message"
        assert transcript_of(caller, done["id"]) == "It is sunny in Paris today."
        assert session.conversation.get(item["id"]).text == "It is sunny in Paris today."
        await caller.wait_for("output_audio_buffer.started", timeout=30)
        # The words were voiced by a second turn reciting them, not by the JSON turn.
        assert (turns[0].speak, turns[1].recite) == (False, "It is sunny in Paris today.")

        # An answer cut off by the length bound is neither called nor spoken.
        say(caller, 'JSON:{"name": "get_weather", "arguments": {"ci')
        cut = (await caller.wait_for("response.done", count=2, timeout=30))["response"]
        assert cut["status"] == "incomplete" and cut["output"] == [], cut
        assert cut["status_details"]["reason"] == "max_output_tokens"
        assert not caller.of_type("response.function_call_arguments.done")
        assert len(caller.of_type("response.output_item.added")) == 1
        assert_valid_events(caller)
    finally:
        await caller.hang_up()
