"""Function calling in a generic format that any chat template carries, for chat completions
and Realtime sessions alike.

No family's chat template has a tool format of its own today, so omnivox uses one for all: the
functions are described to the Thinker in a system message, and it answers in JSON under a
grammar built from their `parameters` schemas (vLLM structured outputs):
`{"name": ..., "arguments": {...}}` to call one or, where it may choose (tool_choice "auto"),
`{"content": "..."}` to answer in words. A call's arguments are therefore always valid JSON for
its function's schema. Earlier calls are shown to the Thinker as that same JSON.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
WORDS: dict[str, Any] = {  # the Thinker's answer in words, when it may choose
    "type": "object", "properties": {"content": {"type": "string"}},
    "required": ["content"], "additionalProperties": False}


@dataclass(frozen=True)
class Function:
    """One function the Thinker may call."""

    name: str
    description: str | None
    parameters: dict[str, Any]


@dataclass(frozen=True)
class FunctionCall:
    """A call the Thinker made: its id (the client's handle on it), name and JSON arguments."""

    name: str
    arguments: str
    call_id: str = field(default_factory=lambda: f"call_{secrets.token_hex(12)}")


@dataclass(frozen=True)
class Answer:
    """What the Thinker answered: words, calls, or (`whole` false) JSON cut off by the length
    bound, kept as the raw text in `content`."""

    content: str | None
    calls: list[FunctionCall] = field(default_factory=list)
    whole: bool = True


def call_schema(function: Function) -> dict[str, Any]:
    """A call of `function`: its name, and arguments that follow its parameters' schema."""
    return {"type": "object",
            "properties": {"name": {"enum": [function.name]}, "arguments": function.parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


def answer_schema(functions: Sequence[Function], words: bool) -> dict[str, Any] | None:
    """The JSON schema the Thinker's answer is generated under: a call of one of `functions`
    or, if `words`, an answer in words; None (free text) when there is no function."""
    options = [call_schema(function) for function in functions]
    if not options:
        return None
    if words:
        options.append(WORDS)
    return options[0] if len(options) == 1 else {"anyOf": options}


def answer_format(functions: Sequence[Function], words: bool) -> dict[str, Any] | None:
    """`answer_schema` as a Thinker job's response_format (pipeline/engines/vllm.py)."""
    schema = answer_schema(functions, words)
    if schema is None:
        return None
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def tools_prompt(functions: Sequence[Function], words: bool) -> str:
    """The system message that tells the Thinker its functions and how to answer."""
    described = json.dumps([{"name": f.name, "description": f.description,
                             "parameters": f.parameters} for f in functions])
    how = 'To call a function, answer with only {"name": NAME, "arguments": {...}}.'
    if words:
        how += ' To answer in words instead, answer with only {"content": TEXT}.'
    return f"You can call these functions: {described}\n{how}"


def with_tools_prompt(messages: list[dict[str, str]], functions: Sequence[Function],
                      words: bool) -> list[dict[str, str]]:
    """`messages` with the tools' system message after the first system message (or first)."""
    at = 1 if messages and messages[0]["role"] == "system" else 0
    prompt = {"role": "system", "content": tools_prompt(functions, words)}
    return [*messages[:at], prompt, *messages[at:]]


def call_text(name: str | None, arguments: str | None) -> str:
    """An earlier call as the Thinker writes it (arguments that are not JSON kept as text)."""
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        parsed = arguments
    return json.dumps({"name": name, "arguments": parsed})


def read_answer(text: str) -> Answer:
    """The answer in `text` (generated under `answer_schema`)."""
    try:
        answer = json.loads(text)
    except json.JSONDecodeError:
        return Answer(text, whole=False)
    if isinstance(answer, dict) and "name" in answer:
        arguments = json.dumps(answer.get("arguments", {}))
        return Answer(None, [FunctionCall(str(answer["name"]), arguments)])
    if isinstance(answer, dict) and isinstance(answer.get("content"), str):
        return Answer(answer["content"])
    return Answer(text, whole=False)
