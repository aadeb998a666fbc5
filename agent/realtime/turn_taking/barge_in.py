"""Barge-in: the caller talking over the agent's reply cuts it off once the speech has lasted
barge_in_min_ms (checked at each frame the VAD hears, as it hears it: no timer between the
frame that makes the floor and the cut), unless it began inside the echo guard just after the
reply's first audio."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from agent.config import ConversationSettings
from agent.ops.metrics import Metrics
from agent.realtime.reply import Reply
from media.vad import SpeechStopped

log = logging.getLogger(__name__)


class Floor(Protocol):
    """What barge-in needs of the conversation: the settings that allow it (and after how
    much speech), the reply the caller hears, and cutting that reply off."""

    @property
    def settings(self) -> ConversationSettings: ...

    def audible_reply(self) -> Reply | None: ...

    def interrupt(self, reason: str, audio_end_ms: int | None = None) -> bool: ...


class BargeIn:
    """The session's watch on the caller's speech over a reply it hears."""

    def __init__(self, floor: Floor, metrics: Metrics, call_id: str) -> None:
        self._floor, self._metrics, self._call_id = floor, metrics, call_id
        self._watched: Reply | None = None  # the reply the speech in progress may cut

    def onset(self) -> None:
        """The caller began to speak: watch it while a reply is audible, barge-in allowed."""
        self._watched = None
        reply = self._floor.audible_reply()
        if reply is None or not self._floor.settings.barge_in:
            return
        if self._in_echo_guard(reply):
            log.debug("call %s: onset ignored by echo guard", self._call_id)
            return
        self._watched = reply

    def heard(self, voiced_ms: int) -> None:
        """A frame of the speech in progress, which has lasted `voiced_ms` so far: cut the
        watched reply, still audible, once that reaches barge_in_min_ms."""
        if self._watching() and voiced_ms >= self._floor.settings.barge_in_min_ms:
            log.info("call %s: barge-in after %d ms of speech", self._call_id, voiced_ms)
            self._barge_in()

    def speech_ended(self, event: SpeechStopped) -> None:
        """The caller's speech ended before a frame of it made the floor (audio sent faster
        than real time, as a WebSocket client may): long enough, it barges in all the same."""
        lasted_ms = event.audio_end_ms - event.audio_start_ms
        if self._watching() and lasted_ms >= self._floor.settings.barge_in_min_ms:
            self._barge_in()
        self._watched = None

    def close(self) -> None:
        self._watched = None

    def _watching(self) -> bool:
        return self._watched is not None and self._floor.audible_reply() is self._watched

    def _in_echo_guard(self, reply: Reply) -> bool:
        guard = self._floor.settings.echo_guard_ms
        if not guard or reply.first_audio_at is None:
            return False
        return (asyncio.get_running_loop().time() - reply.first_audio_at) * 1000 < guard

    def _barge_in(self) -> None:
        """The caller's speech takes the floor: what the caller hears now is cut off."""
        self._watched = None
        self._metrics.barge_ins.inc()
        self._floor.interrupt("turn_detected")
