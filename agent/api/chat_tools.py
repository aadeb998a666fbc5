"""Function calling in chat completions, in a generic format that any chat template carries.

No family's chat template has a tool format of its own today, so omnivox uses one for all: the
functions are described to the Thinker in a system message, and it answers in JSON under a
grammar built from their `parameters` schemas (vLLM structured outputs):
`{"name": ..., "arguments": {...}}` to call one or, where `tool_choice` lets it choose
("auto", the default with tools), `{"content": "..."}` to answer in words. A call's arguments
are therefore always valid JSON for its function's schema. The answer is unwrapped into
OpenAI's `tool_calls` (finish_reason `tool_calls`) or plain content. Earlier calls in the
history are shown to the Thinker as that same JSON, and `tool` messages as they are.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
WORDS: dict[str, Any] = {  # the Thinker's answer in words, when it may choose
    "type": "object", "properties": {"content": {"type": "string"}},
    "required": ["content"], "additionalProperties": False}


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: dict(NO_PARAMETERS))
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(BaseModel):
    name: str


class NamedChoice(BaseModel):
    """`tool_choice` naming the one function to call."""

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedChoice


def call_schema(tool: Tool) -> dict[str, Any]:
    """A call of `tool`: its name, and arguments that follow its parameters' schema."""
    return {"type": "object",
            "properties": {"name": {"enum": [tool.function.name]},
                           "arguments": tool.function.parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


def chosen(tools: list[Tool], choice: ToolChoice) -> list[Tool]:
    """The tools the answer may call: all of them, or the one named."""
    if isinstance(choice, NamedChoice):
        return [t for t in tools if t.function.name == choice.function.name]
    return [] if choice == "none" else tools


def answer_schema(tools: list[Tool], choice: ToolChoice) -> dict[str, Any] | None:
    """The JSON schema the Thinker's answer is generated under; None: free text."""
    options = [call_schema(tool) for tool in chosen(tools, choice)]
    if not options:
        return None
    if choice == "auto":
        options.append(WORDS)
    return options[0] if len(options) == 1 else {"anyOf": options}


def tools_prompt(tools: list[Tool], choice: ToolChoice) -> str:
    """The system message that tells the Thinker its functions and how to answer."""
    callable_ = chosen(tools, choice)
    described = json.dumps([{"name": t.function.name, "description": t.function.description,
                             "parameters": t.function.parameters} for t in callable_])
    how = ('To call a function, answer with only {"name": NAME, "arguments": {...}}.')
    if choice == "auto":
        how += ' To answer in words instead, answer with only {"content": TEXT}.'
    return f"You can call these functions: {described}\n{how}"


def call_as_text(call: dict[str, Any]) -> str:
    """An earlier assistant tool call as the Thinker wrote it (the generic format)."""
    function = call.get("function") or {}
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError:
        arguments = function.get("arguments")
    return json.dumps({"name": function.get("name"), "arguments": arguments})


@dataclass
class Answer:
    """What the Thinker answered: words, or calls."""

    content: str | None
    calls: list[dict[str, Any]] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content,
                                   "refusal": None}
        return {**message, "tool_calls": self.calls} if self.calls else message


def read_answer(text: str) -> Answer:
    """The answer in `text`; a cut one (the length bound reached mid-JSON) is left as text."""
    try:
        answer = json.loads(text)
    except json.JSONDecodeError:
        return Answer(text)
    if isinstance(answer, dict) and "name" in answer:
        call = {"id": f"call_{secrets.token_hex(12)}", "type": "function",
                "function": {"name": answer["name"],
                             "arguments": json.dumps(answer.get("arguments", {}))}}
        return Answer(None, [call])
    if isinstance(answer, dict) and isinstance(answer.get("content"), str):
        return Answer(answer["content"])
    return Answer(text)
