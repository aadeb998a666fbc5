"""What a conversation session needs of the call it runs on, whatever carries the call: a
WebRTC peer connection (agent/calls/call.py) or a WebSocket (agent/calls/websocket_call.py).
The session never touches the media itself: it plays audio and sends events through this."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import numpy as np

from agent.config import Settings
from agent.ops.metrics import Metrics
from agent.ops.records import CallRecords
from agent.realtime.session_config import SessionConfig
from media.vad import VadSegmenter


class AudioOutEnded(Exception):
    """The call's outgoing audio stopped under the session: its connection is going away."""


class AudioOut(Protocol):
    """The agent's audio towards the caller, as far as the session follows it."""

    on_playing_changed: Callable[[bool], None] | None

    @property
    def played_ms(self) -> int:
        """Agent audio the caller has had played so far (on the call's clock)."""
        ...

    @property
    def queued_ms(self) -> int:
        """Agent audio written and not yet played."""
        ...

    @property
    def playing(self) -> bool: ...

    def flush(self) -> int:
        """Drop what is queued (barge-in); the ms dropped."""
        ...


class CallTransport(Protocol):
    """One call as its session sees it."""

    id: str
    settings: Settings
    vad: VadSegmenter  # the caller's speech as it goes (its settings are the session's to tell)
    metrics: Metrics
    records: CallRecords

    @property
    def start(self) -> SessionConfig:
        """The configuration the call's session starts with (the server's, the offer's
        session, a resumed call's); the session owns it from then on."""
        ...

    def run_with(self, config: SessionConfig) -> None:
        """Take the caller's audio as the session's `config` says from the next frame: through
        the VAD with its settings, or into the buffer the client commits (no server VAD)."""
        ...

    # Read-only to the session: a call's outbound is its own kind of AudioOut (an aiortc
    # track, a WebSocket's playout clock), which a settable member would have to be exactly.
    @property
    def outbound(self) -> AudioOut: ...

    def send_event(self, event: dict[str, Any]) -> None: ...

    async def play(self, response_id: str, item_id: str, pcm: np.ndarray, rate: int) -> None:
        """Queue one chunk of a reply's audio; waits while the call holds as much as it may.
        Raises AudioOutEnded when the call can no longer play anything."""
        ...

    def take_input(self) -> np.ndarray | None:
        """The caller's audio appended since the last commit (no server VAD), 16 kHz."""
        ...

    def clear_input(self) -> None: ...

    def end_utterance(self) -> bool: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    async def end(self, code: str, message: str) -> None: ...
