"""The official `openai` SDK (sync and async) against the real product on the tiny family:
/v1/models, and chat completions on the profile's Thinker, streamed or not, with JSON schemas
enforced by guided decoding (valid even on random weights), OpenAI-shaped refusals (404, 400
naming the field) and the bound on completions in flight (429). The server and its engines are
the module's `tiny_server`."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import openai
import pytest

from agent.api.chat_completions import ENGINE
from pipeline.turns.events import AudioChunk, Turn, TurnDone
from tests.openai_clients import clients
from tests.served import Served

pytestmark = pytest.mark.engines

USER = [{"role": "user", "content": "What is the capital of France?"}]
PERSON = {
    "type": "object",
    "properties": {
        # A pattern bounds a string on random weights (xgrammar's maxLength rule would let raw
        # control characters through: invalid JSON; see docs/serving.md)
        "name": {"type": "string", "pattern": "^[a-z]{1,12}$"},
        "floor": {"type": "integer", "minimum": -2, "maximum": 99},
        "mood": {"enum": ["calm", "busy", "away"]},
        "callback": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "floor", "mood", "callback", "tags"],
    "additionalProperties": False,
}


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city now",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                       "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                                      "unit": {"enum": ["C", "F"]}}}}},
    {"type": "function", "function": {
        "name": "book_table", "parameters": {
            "type": "object", "additionalProperties": False, "required": ["people", "time"],
            "properties": {"people": {"type": "integer", "minimum": 1, "maximum": 12},
                           "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}}}}},
]
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}



async def test_models_list_and_retrieve(tiny_server: Served) -> None:
    sync, client = clients(tiny_server)
    listed = await asyncio.to_thread(sync.models.list)  # the server runs on this loop
    assert [model.id for model in listed.data] == ["tiny@1"]
    model = listed.data[0].model_dump()
    assert model["default"] is True and model["version"] == "1" and model["name"] == "tiny"
    assert model["object"] == "model" and model["created"] > 0  # the checkpoint's build time
    assert {name: stage["state"] for name, stage in model["stages"].items()} == {
        "thinker": "ready", "talker": "ready", "voicebox": "ready"}
    pinned, unpinned = await client.models.retrieve("tiny@1"), await client.models.retrieve("tiny")
    assert pinned.id == unpinned.id == "tiny@1"  # an unpinned name is its default version
    for unknown in ("tiny@2", "nope"):
        with pytest.raises(openai.NotFoundError) as missing:
            await client.models.retrieve(unknown)
        assert missing.value.body["code"] == "model_not_found"


async def test_a_chat_completion_and_its_usage(tiny_server: Served) -> None:
    sync, _ = clients(tiny_server)
    reply = await asyncio.to_thread(sync.chat.completions.create, model="tiny", messages=USER,
                                    max_completion_tokens=12, temperature=0.7, top_p=0.9,
                                    seed=5)  # a seed never reaches the CPU engine: it lives
    assert reply.object == "chat.completion" and reply.model == "tiny@1"
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    # Random weights never choose EOS: the reply is exactly the bound long.
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 12 and reply.usage.prompt_tokens > 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 12
    legacy = await asyncio.to_thread(sync.chat.completions.create, model="tiny@1",
                                     messages=USER, max_tokens=3)
    assert legacy.usage.completion_tokens == 3


async def test_a_stop_sequence_ends_the_reply_before_it(tiny_server: Served) -> None:
    _, client = clients(tiny_server)
    ask: dict[str, Any] = {"model": "tiny", "messages": USER, "max_completion_tokens": 24,
                           "temperature": 0}  # greedy: the same reply twice
    text = (await client.chat.completions.create(**ask)).choices[0].message.content
    stop = text[len(text) // 2:len(text) // 2 + 2]
    cut = await client.chat.completions.create(**ask, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[:text.index(stop)]


async def test_streaming_chunks_usage_and_done(tiny_server: Served) -> None:
    _, client = clients(tiny_server)
    stream = await client.chat.completions.create(
        model="tiny", messages=USER, max_completion_tokens=16, stream=True,
        stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]  # the SDK stops at data: [DONE]
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    texts = [c.choices[0].delta.content for c in chunks[1:-2] if c.choices[0].delta.content]
    assert len(texts) >= 2  # streamed in pieces, not in one
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert all(chunk.usage is None for chunk in chunks[:-1])


@pytest.mark.parametrize("streamed", [False, True])
async def test_json_schema_output_validates_even_on_random_weights(
    tiny_server: Served, streamed: bool
) -> None:
    _, client = clients(tiny_server)
    ask: dict[str, Any] = {
        "model": "tiny", "messages": USER, "max_completion_tokens": 200, "temperature": 1.0,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "person", "schema": PERSON, "strict": True}}}
    for _ in range(3):  # sampled: three different objects, each valid
        if streamed:
            pieces = [c.choices[0].delta.content or "" async for c in
                      await client.chat.completions.create(**ask, stream=True) if c.choices]
            content = "".join(pieces)
        else:
            reply = await client.chat.completions.create(**ask)
            assert reply.choices[0].finish_reason == "stop"  # the object closed, not cut
            content = reply.choices[0].message.content
        jsonschema.validate(json.loads(content), PERSON)


async def test_json_object_is_an_object(tiny_server: Served) -> None:
    _, client = clients(tiny_server)
    reply = await client.chat.completions.create(
        model="tiny", messages=USER, max_completion_tokens=900, temperature=0,
        response_format={"type": "json_object"})
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


async def test_unknown_model_is_a_404(tiny_server: Served) -> None:
    _, client = clients(tiny_server)
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(model="tiny@7", messages=USER)
    assert missing.value.body["code"] == "model_not_found"
    assert missing.value.body["param"] == "model"


@pytest.mark.parametrize(("ask", "param"), [
    ({"n": 2}, "n"),
    ({"tool_choice": "required"}, "tool_choice"),  # no tools to choose from
    ({"temperature": 3}, "temperature"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "data:,"}}]}]}, "messages[0].content"),
    ({"logprobs": True}, "logprobs"),  # not honoured: refused, not ignored
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    # A schema the engine's grammar compiler refuses: never free text instead
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strng"}}}}}},
     "response_format"),
    # String length bounds, which xgrammar lets control characters through (invalid JSON);
    # a property named like the keyword is a name, not the keyword
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"maxLength": {"type": "string", "maxLength": 8}}}}}},
     "response_format.json_schema.schema.properties.maxLength.maxLength"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "minLength": 1}}}}}]},
     "tools[0].function.parameters.properties.q.minLength"),
])
async def test_a_bad_request_is_a_400_naming_the_field(
    tiny_server: Served, ask: dict[str, Any], param: str
) -> None:
    _, client = clients(tiny_server)
    request = {"model": "tiny", "messages": USER, "max_completion_tokens": 4, **ask}
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(**request)
    body = refused.value.body
    assert body["param"] == param, body
    assert param.split(".")[0].split("[")[0] in body["message"]
    assert tiny_server.app.state.completion_slots.held(ENGINE) == 0  # nothing left held


async def test_a_body_too_large_is_a_413(tiny_server: Served) -> None:
    _, client = clients(tiny_server)
    huge = [{"role": "user", "content": "x" * (2 << 20)}]
    with pytest.raises(openai.APIStatusError) as refused:
        await client.chat.completions.create(model="tiny", messages=huge)
    assert refused.value.status_code == 413


async def engine_requests(served: Served) -> list[str]:
    return (await served.app.state.pipeline.active_requests())[ENGINE].engine_ids


LONG: dict[str, Any] = {"model": "tiny", "messages": USER, "max_completion_tokens": 900,
                        "stream": True}  # about as long as the tiny Thinker's context allows


async def generating(client: openai.AsyncOpenAI, count: int) -> tuple[list[Any], set[str]]:
    """`count` long streamed completions, each generating (its first content has come)."""
    streams = [await client.chat.completions.create(**LONG) for _ in range(count)]
    ids = set()
    for stream in streams:
        async for chunk in stream:
            ids.add(chunk.id)
            if chunk.choices and chunk.choices[0].delta.content:
                break
    return streams, ids


async def test_completions_beyond_the_bound_get_429_and_a_gone_client_aborts(
    tiny_server: Served
) -> None:
    _, client = clients(tiny_server)
    limit = tiny_server.app.state.settings.max_completions_in_flight
    streams, ids = await generating(client, limit)
    with pytest.raises(openai.RateLimitError) as refused:
        await client.chat.completions.create(**LONG)
    assert refused.value.response.headers["retry-after"] == "1"
    assert refused.value.body["code"] == "too_many_requests"
    held = [rid for rid in await engine_requests(tiny_server) if rid.split("/")[1] in ids]
    assert len(held) == limit  # the bound was reached by requests still generating
    for stream in streams:  # the clients go away mid-reply
        await stream.close()
    for _ in range(500):  # their engine requests are aborted (no wall-clock bound asserted)
        if not any(rid.split("/")[1] in ids for rid in await engine_requests(tiny_server)):
            break
        await asyncio.sleep(0.02)
    assert not any(rid.split("/")[1] in ids for rid in await engine_requests(tiny_server))
    for _ in range(500):
        if tiny_server.app.state.completion_slots.held(ENGINE) == 0:
            break
        await asyncio.sleep(0.02)
    assert tiny_server.app.state.completion_slots.held(ENGINE) == 0
    again = await client.chat.completions.create(**{**LONG, "stream": False,
                                                    "max_completion_tokens": 2})
    assert again.usage.completion_tokens == 2  # room again once they were gone


async def test_required_tool_calls_have_arguments_valid_for_their_schema(
    tiny_server: Served
) -> None:
    _, client = clients(tiny_server)
    for _ in range(3):  # sampled on random weights: each call valid all the same
        reply = await client.chat.completions.create(
            model="tiny", messages=USER, tools=TOOLS, tool_choice="required", temperature=1.0,
            max_completion_tokens=200)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


async def test_a_named_tool_streamed_and_its_result_answered(tiny_server: Served) -> None:
    _, client = clients(tiny_server)
    named = {"type": "function", "function": {"name": "book_table"}}
    chunks = [chunk async for chunk in await client.chat.completions.create(
        model="tiny", messages=USER, tools=TOOLS, tool_choice=named, stream=True,
        max_completion_tokens=200)]
    (call,) = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert call.function.name == "book_table"
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS["book_table"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": [{
        "id": call.id, "type": "function", "function": {
            "name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "booked"}]
    reply = await client.chat.completions.create(
        model="tiny", messages=history, tools=TOOLS, tool_choice="none",
        max_completion_tokens=8)
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content


async def test_a_client_gone_before_its_whole_answer_aborts_the_request(
    tiny_server: Served
) -> None:
    """Not streamed: the client closes its connection while the reply is generated."""
    _, client = clients(tiny_server)
    asked = asyncio.create_task(client.chat.completions.create(
        model="tiny", messages=USER, max_completion_tokens=900))
    for _ in range(1500):  # until the engine holds it
        if any(rid.startswith("completions/") for rid in await engine_requests(tiny_server)):
            break
        await asyncio.sleep(0.02)
    assert not asked.done()  # 900 tokens on one core: still generating
    asked.cancel()  # the SDK's connection closes with it
    for _ in range(500):
        if (tiny_server.app.state.completion_slots.held(ENGINE) == 0 and not any(
                rid.startswith("completions/") for rid in await engine_requests(tiny_server))):
            break
        await asyncio.sleep(0.02)
    assert tiny_server.app.state.completion_slots.held(ENGINE) == 0
    assert not any(rid.startswith("completions/") for rid in await engine_requests(tiny_server))


async def test_a_calls_turn_is_answered_beside_a_burst_of_completions(
    tiny_server: Served
) -> None:
    """The completions share the engines with the calls: a turn started while the bound's worth
    of them generate (and more are refused) gets its whole reply, text and audio, while they
    are still generating."""
    _, client = clients(tiny_server)
    limit = tiny_server.app.state.settings.max_completions_in_flight
    streams, ids = await generating(client, limit)
    try:
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(**LONG)
        turn = Turn("beside-completions", USER, max_tokens=16, call_id="test-call")
        events = [event async for event in tiny_server.app.state.pipeline.respond(turn)]
        assert isinstance(events[-1], TurnDone), events[-1]
        assert any(isinstance(event, AudioChunk) for event in events)
        held = [rid for rid in await engine_requests(tiny_server) if rid.split("/")[1] in ids]
        assert len(held) == limit  # they were generating all along
    finally:
        for stream in streams:
            await stream.close()
