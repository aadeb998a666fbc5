"""Function calling in chat completions: OpenAI's `tools`, `tool_choice` and `tool_calls` over
the generic format of agent/guided/functions.py (a call is generated under a grammar built from
its function's `parameters` schema). A call's answer is unwrapped into `tool_calls` (finish_reason
`tool_calls`) or plain content; earlier calls in the history are shown to the Thinker as the
generic JSON, and `tool` messages as they are.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent.guided.functions import (
    NO_PARAMETERS,
    Answer,
    Function,
    answer_format,
    call_text,
    with_tools_prompt,
)


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

    def generic(self) -> Function:
        spec = self.function
        return Function(spec.name, spec.description, spec.parameters)


class NamedFunction(BaseModel):
    name: str


class NamedChoice(BaseModel):
    """`tool_choice` naming the one function to call."""

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedChoice


def chosen(tools: list[Tool], choice: ToolChoice) -> list[Function]:
    """The functions the answer may call: all of them, or the one named."""
    if isinstance(choice, NamedChoice):
        return [t.generic() for t in tools if t.function.name == choice.function.name]
    return [] if choice == "none" else [t.generic() for t in tools]


def tools_format(tools: list[Tool], choice: ToolChoice) -> dict[str, Any] | None:
    """The response_format the Thinker's answer is generated under; None: free text."""
    return answer_format(chosen(tools, choice), choice == "auto")


def tools_messages(messages: list[dict[str, str]], tools: list[Tool],
                   choice: ToolChoice) -> list[dict[str, str]]:
    """`messages` with the system message describing the functions the answer may call."""
    return with_tools_prompt(messages, chosen(tools, choice), choice == "auto")


def call_as_text(call: dict[str, Any]) -> str:
    """An earlier assistant tool call (OpenAI's shape) as the Thinker wrote it."""
    function = call.get("function") or {}
    return call_text(function.get("name"), function.get("arguments"))


def message_of(answer: Answer) -> dict[str, Any]:
    """The assistant's message: its words, or its tool calls in OpenAI's shape."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None}
    if not answer.calls:
        return message
    return {**message, "tool_calls": tool_calls(answer)}


def tool_calls(answer: Answer) -> list[dict[str, Any]]:
    return [{"id": call.call_id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}
            for call in answer.calls]
