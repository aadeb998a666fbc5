"""What `POST /v1/chat/completions` answers: OpenAI's `chat.completion` object, or its
`chat.completion.chunk`s as server-sent events ending with `data: [DONE]`."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from pipeline.stage import ThinkerOutput

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying `payload` as JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def finish_reason(engine_reason: str | None) -> str:
    """OpenAI's finish_reason for the engine's: the length bound, or a natural stop (EOS, a
    stop sequence, the end of a guided JSON object)."""
    return "length" if engine_reason == "length" else "stop"


@dataclass
class Completion:
    """One completion: its id, model and running token counts."""

    model: str
    id: str = field(default_factory=lambda: f"chatcmpl-{secrets.token_hex(12)}")
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def count(self, output: ThinkerOutput) -> None:
        self.prompt_tokens = output.prompt_tokens or self.prompt_tokens
        self.completion_tokens += len(output.token_ids)

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def whole(self, message: dict[str, Any], reason: str) -> dict[str, Any]:
        """The non-streamed answer: the assistant's message (chat_tools.message_of)."""
        choice = {"index": 0, "message": message, "finish_reason": reason, "logprobs": None}
        return {**self._head("chat.completion"), "choices": [choice], "usage": self.usage()}

    def chunk(self, delta: dict[str, Any], reason: str | None = None,
              with_usage: bool = False) -> dict[str, Any]:
        """A streamed piece; `with_usage` (stream_options.include_usage) adds `usage: null`,
        the final usage chunk carrying the figures."""
        choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
        body = {**self._head("chat.completion.chunk"), "choices": [choice]}
        return {**body, "usage": None} if with_usage else body

    def usage_chunk(self) -> dict[str, Any]:
        """The last chunk with include_usage: no choices, the whole request's usage."""
        return {**self._head("chat.completion.chunk"), "choices": [], "usage": self.usage()}
