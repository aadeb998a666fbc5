"""The body of `POST /v1/chat/completions`: pydantic models of what omnivox honours.

Anything it cannot honour is refused (400 naming the field), never dropped: a field it does
not know, `n` other than 1, a content part other than text, a `response_format` or `tools`
it cannot enforce. `developer` messages count as `system` ones.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agent.api.chat_tools import (
    NamedChoice,
    Tool,
    ToolChoice,
    call_as_text,
    tools_format,
    tools_messages,
)
from agent.api.request_body import BadRequest
from agent.guided.unsafe_schema import REFUSAL, unsafe_keyword

MAX_STOP_SEQUENCES = 4  # OpenAI's own bound
# No max_completion_tokens: the reply may take whatever the prompt leaves of the context.
UNBOUNDED_TOKENS = 1 << 20


class Message(BaseModel):
    """One chat message; content is text, or a list of text parts."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    @model_validator(mode="after")
    def _tool_message_names_its_call(self) -> Message:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        return self

    @field_validator("content")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        if isinstance(content, list):
            for index, part in enumerate(content):
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"part {index}: only text parts ({{'type': 'text', "
                                     f"'text': ...}}) are supported, not {part.get('type')!r}")
        return content

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part["text"] for part in self.content)
        return self.content or ""

    def for_thinker(self) -> dict[str, str]:
        if self.tool_calls:  # shown as the Thinker writes calls (chat_tools.py)
            return {"role": "assistant",
                    "content": "\n".join(call_as_text(call) for call in self.tool_calls)}
        return {"role": "system" if self.role == "developer" else self.role,
                "content": self.text()}


class JsonSchemaSpec(BaseModel):
    """`response_format.json_schema`: the schema the reply must follow."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """`text`, `json_object` (any JSON object) or `json_schema` (that schema), enforced by the
    engine's guided decoding."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type 'json_schema', and only then")
        return self

    def for_thinker(self) -> dict[str, Any] | None:
        """What the Thinker job carries (pipeline/engines/vllm.py, json_schema_of)."""
        if self.type == "json_schema":
            assert self.json_schema is not None  # the validator saw to it
            return {"type": "json_schema", "json_schema": {
                "name": self.json_schema.name, "schema": self.json_schema.schema_}}
        return {"type": "json_object"} if self.type == "json_object" else None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """The request; unknown fields are refused rather than ignored."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)  # the older name of max_completion_tokens
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None  # one call at most is made, whatever it says
    # Accepted and not acted on: they change nothing in the reply.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 (one choice per request) is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        if isinstance(stop, list) and not all(stop):
            raise ValueError("stop sequences must not be empty")
        return stop

    @model_validator(mode="after")
    def _options_with_stream(self) -> ChatCompletionRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only with stream=true")
        return self

    @model_validator(mode="after")
    def _schemas_guided_exactly(self) -> ChatCompletionRequest:
        schemas = [(f"tools[{i}].function.parameters", tool.function.parameters)
                   for i, tool in enumerate(self.tools or [])]
        if self.response_format and self.response_format.json_schema:
            schemas.append(("response_format.json_schema.schema",
                            self.response_format.json_schema.schema_))
        for field, schema in schemas:
            found = unsafe_keyword(schema)
            if found is not None:
                raise BadRequest(REFUSAL, f"{field}.{found}")
        return self

    @model_validator(mode="after")
    def _tools_consistent(self) -> ChatCompletionRequest:
        names = [tool.function.name for tool in self.tools or []]
        if self.tool_choice is not None and self.tool_choice != "none" and not names:
            raise BadRequest("tool_choice needs tools", "tool_choice")
        named = self.tool_choice
        if isinstance(named, NamedChoice) and named.function.name not in names:
            raise BadRequest(f"tool_choice names {named.function.name!r}, which is not among "
                             f"the tools", "tool_choice")
        if self.calls_tools() and self.response_format and self.response_format.type != "text":
            raise BadRequest("response_format cannot apply where tools shape the answer "
                             "(use tool_choice 'none')", "response_format")
        return self

    def choice(self) -> ToolChoice:
        """tool_choice as it applies: unset, "auto" with tools (OpenAI's default)."""
        return self.tool_choice or ("auto" if self.tools else "none")

    def calls_tools(self) -> bool:
        """Whether the answer is generated in the tool format (chat_tools.py)."""
        return tools_format(self.tools or [], self.choice()) is not None

    def thinker_format(self) -> dict[str, Any] | None:
        """The structure the Thinker's answer is guided to: the tools', or response_format."""
        tools = tools_format(self.tools or [], self.choice())
        if tools is not None:
            return tools
        return self.response_format.for_thinker() if self.response_format else None

    def thinker_messages(self) -> list[dict[str, str]]:
        """The history for the Thinker, the tools' system message after the first system
        message (or first)."""
        messages = [message.for_thinker() for message in self.messages]
        if not self.calls_tools():
            return messages
        return tools_messages(messages, self.tools or [], self.choice())

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def reply_tokens(self) -> int:
        return self.max_completion_tokens or self.max_tokens or UNBOUNDED_TOKENS

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage
