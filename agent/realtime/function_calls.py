"""Function calling in a Realtime session: its `tools` and `tool_choice` (set by session.update,
the call's session, or one response.create), checked once; the Thinker then answers in the
generic JSON format of agent/guided/functions.py, read back as a call or as words."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.guided.functions import NO_PARAMETERS, Function, answer_format, with_tools_prompt
from agent.guided.unsafe_schema import REFUSAL, unsafe_keyword

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CHOICES = ("none", "auto", "required")


class ToolsError(ValueError):
    """`tools` or `tool_choice` asking for what this server refuses (the message names it)."""


@dataclass(frozen=True)
class SessionTools:
    """The functions a session's replies may call, and how they may (tool_choice: none, auto,
    required, or `named` alone)."""

    functions: tuple[Function, ...] = ()
    choice: str = "auto"
    named: str | None = None

    def callable(self) -> list[Function]:
        if self.choice == "none":
            return []
        return [f for f in self.functions if self.named is None or f.name == self.named]

    def answer_format(self) -> dict[str, Any] | None:
        """The Thinker's response_format; None: it answers in free text (no function)."""
        return answer_format(self.callable(), self.choice == "auto")

    def thinker_messages(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        return with_tools_prompt(messages, self.callable(), self.choice == "auto")

    def tools_field(self) -> list[dict[str, Any]]:
        """`tools` as the session object shows them."""
        return [{"type": "function", "name": f.name, "description": f.description or "",
                 "parameters": f.parameters} for f in self.functions]

    def choice_field(self) -> str | dict[str, str]:
        """`tool_choice` as the session object shows it."""
        return {"type": "function", "name": self.named} if self.named else self.choice


def configure_tools(update: Any, current: SessionTools) -> SessionTools:
    """`current` with the `tools` and `tool_choice` of `update` (a session or response
    object); ToolsError naming the first value refused."""
    tools = getattr(update, "tools", None)
    functions = current.functions if tools is None else _functions(tools)
    choice, named = current.choice, current.named
    if getattr(update, "tool_choice", None) is not None:
        choice, named = _choice(update.tool_choice)
    if named is not None and named not in {f.name for f in functions}:
        raise ToolsError(f"tool_choice names {named!r}, which is not among the tools")
    # 'required' with no tools yet stands (LiveKit and pipecat send it before their tools);
    # until tools come, the Thinker answers in words.
    return SessionTools(functions, choice, named)


def _functions(tools: Sequence[Any]) -> tuple[Function, ...]:
    functions = tuple(_function(index, tool) for index, tool in enumerate(tools))
    names = [f.name for f in functions]
    if len(set(names)) < len(names):
        raise ToolsError("tools: each function needs a name of its own")
    return functions


def _function(index: int, tool: Any) -> Function:
    where = f"tools[{index}]"
    if getattr(tool, "type", None) != "function":
        raise ToolsError(f"{where}: only function tools are supported, not {tool.type!r}")
    if not isinstance(tool.name, str) or not NAME.match(tool.name):
        raise ToolsError(f"{where}.name: 1-64 letters, digits, '_' or '-' are required")
    parameters = dict(NO_PARAMETERS) if tool.parameters is None else tool.parameters
    if not isinstance(parameters, dict):
        raise ToolsError(f"{where}.parameters: a JSON schema object is required")
    found = unsafe_keyword(parameters)
    if found is not None:
        raise ToolsError(f"{where}.parameters.{found}: {REFUSAL}")
    return Function(tool.name, tool.description, parameters)


def _choice(choice: Any) -> tuple[str, str | None]:
    if isinstance(choice, str):
        return choice, None  # one of CHOICES: openai's model allows no other string
    if getattr(choice, "type", None) == "function":
        return "required", choice.name
    raise ToolsError(f"tool_choice {getattr(choice, 'type', choice)!r} is not supported "
                     f"({', '.join(CHOICES)} or a function)")
