"""Resuming a dropped call: its caller comes back within the grace and keeps the conversation.

Every resumable call gets a token (sent in its `session.created`). While the call lives, the
token names it; when the call ends because its connection went away (not a hang-up, not a
limit), its conversation (history and session settings) is parked under the token for
`resume_grace_s`. A new call that presents the token within the grace takes the conversation
over, and a call still live under that token (its caller's network dropped before the server
noticed) is closed in its favour. Each token works once; parked conversations are freed at the
end of the grace, and at most `limit` are held (the oldest freed first).

Only SHA-256 digests of tokens are kept, as for client secrets (agent/api/auth.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections import OrderedDict

from agent.realtime.session_config import SavedConversation

# How a call ended that its caller may come back from: the connection went away under it, or
# a new call took it over while it still lived.
RESUMABLE_ENDS = frozenset({"connection_failed", "connection_closed", "media_failed",
                            "resumed"})


class ResumeError(Exception):
    """No conversation to resume under the token given (wrong, used, or past the grace)."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class ResumeStore:
    """Tokens of live calls, and the parked conversations of dropped ones (bounded)."""

    def __init__(self, grace_s: float, limit: int) -> None:
        self.grace_s = grace_s
        self.limit = limit
        self._live: dict[bytes, str] = {}  # digest -> the live call it names
        self._parked: OrderedDict[bytes, tuple[SavedConversation, asyncio.TimerHandle]] = (
            OrderedDict()
        )

    @property
    def enabled(self) -> bool:
        return self.grace_s > 0

    def __len__(self) -> int:
        """Conversations parked now."""
        return len(self._parked)

    def issue(self, call_id: str) -> str | None:
        """A new token naming the live call `call_id` (None when resuming is off)."""
        if not self.enabled:
            return None
        token = "rt_" + secrets.token_urlsafe(24)
        self._live[_digest(token)] = call_id
        return token

    def live_call(self, token: str) -> str | None:
        """The live call this token names, if any."""
        return self._live.get(_digest(token))

    def ended(self, token: str, reason: str, saved: SavedConversation | None) -> None:
        """The call of `token` ended for `reason`: its conversation is parked for the grace
        when the caller may come back, else the token is forgotten."""
        digest = _digest(token)
        self._live.pop(digest, None)
        if saved is None or reason not in RESUMABLE_ENDS:
            return
        while len(self._parked) >= self.limit:
            _, (_, oldest) = self._parked.popitem(last=False)
            oldest.cancel()
        timer = asyncio.get_running_loop().call_later(self.grace_s, self._expire, digest)
        self._parked[digest] = (saved, timer)

    def take(self, token: str) -> SavedConversation:
        """The conversation parked under `token`, which no longer holds it; ResumeError when
        there is none."""
        if not self.enabled:
            raise ResumeError("this server resumes no calls (resume_grace_s is 0); place the "
                              "call without a resume token")
        parked = self._parked.pop(_digest(token), None)
        if parked is None:
            raise ResumeError(
                "no dropped call to resume with this token: it is wrong, was already used, or "
                f"its grace of {self.grace_s:g} s has passed; place the call without it for a "
                "new conversation"
            )
        saved, timer = parked
        timer.cancel()
        return saved

    def _expire(self, digest: bytes) -> None:
        self._parked.pop(digest, None)
