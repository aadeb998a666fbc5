"""A call's conversation history (bounded), and which part of a reply the caller actually heard."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Item:
    """One message of the conversation, as the Thinker sees it."""

    item_id: str
    role: str  # "user" | "assistant" | "tool" (a function's output)
    text: str
    call_id: str | None = None  # a function call, or the output of one
    heard: bool = False  # the caller's speech (its text is the transcript), not typed


class Conversation:
    """The last `max_items` messages of a call at most; the system instructions are kept apart.

    Past `max_items`, the oldest go a quarter of them at a time, not one by one: the history's
    start then stays the same for the next few turns, and the Thinker's engine keeps serving
    the prompt from its prefix cache instead of prefilling the whole history every turn."""

    def __init__(self, instructions: str, max_items: int = 32) -> None:
        self.instructions = instructions
        self.max_items = max_items
        self._items: deque[Item] = deque()

    def add(self, item_id: str, role: str, text: str, call_id: str | None = None,
            heard: bool = False) -> Item:
        item = Item(item_id, role, text, call_id, heard)
        self._items.append(item)
        if len(self._items) > self.max_items:
            for _ in range(max(1, self.max_items // 4)):
                self._items.popleft()
        return item

    def function_call(self, call_id: str) -> Item | None:
        """The agent's call `call_id`, while the history still holds it."""
        return next((i for i in self._items if i.call_id == call_id and i.role == "assistant"),
                    None)

    def get(self, item_id: str) -> Item | None:
        return next((i for i in self._items if i.item_id == item_id), None)

    def delete(self, item_id: str) -> bool:
        """Take `item_id` out of the history (the next turn's Thinker no longer sees it)."""
        item = self.get(item_id)
        if item is not None:
            self._items.remove(item)
        return item is not None

    @property
    def items(self) -> list[Item]:
        return list(self._items)

    def messages(self) -> list[dict[str, str]]:
        """Chat messages for the Thinker: system first, then the items that have text."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        return system + [{"role": i.role, "content": i.text} for i in self._items if i.text]


@dataclass
class SpokenText:
    """Maps audio played of one reply back to the reply text it voiced.

    Each audio chunk carries the span of reply text it speaks; the text heard up to `played_ms`
    is every fully played chunk's span plus the played share of the chunk in progress, cut back
    to a word boundary.
    """

    _ends_ms: list[int] = field(default_factory=list)  # cumulative audio end of each chunk
    _spans: list[tuple[int, int]] = field(default_factory=list)  # (text_start, text_end)

    @property
    def total_ms(self) -> int:
        return self._ends_ms[-1] if self._ends_ms else 0

    def add_chunk(self, duration_ms: int, text_start: int, text_end: int) -> None:
        """Audio voicing reply[text_start:text_end]; several chunks may voice one span."""
        if self._spans and self._spans[-1] == (text_start, text_end):
            self._ends_ms[-1] += duration_ms
            return
        self._ends_ms.append(self.total_ms + duration_ms)
        self._spans.append((text_start, text_end))

    def heard(self, reply: str, played_ms: int) -> str:
        """The part of `reply` voiced by the first `played_ms` of audio."""
        if not self._ends_ms or played_ms <= 0:
            return ""
        k = bisect.bisect_right(self._ends_ms, played_ms)
        if k >= len(self._ends_ms):
            return reply[: self._spans[-1][1]].strip()
        start, end = self._spans[k]
        chunk_start_ms = self._ends_ms[k - 1] if k else 0
        share = (played_ms - chunk_start_ms) / max(1, self._ends_ms[k] - chunk_start_ms)
        partial = reply[start : start + int(share * (end - start))]
        # Keep whole words only: a word cut in half was not heard as that word.
        partial = partial[: partial.rfind(" ")] if " " in partial else ""
        return (reply[:start] + partial).strip()
