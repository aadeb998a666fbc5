"""Barge-in: the caller talking over the agent's reply cuts it off once the speech has lasted
barge_in_min_ms (a watch polls the VAD at each frame), unless it began inside the echo guard
just after the reply's first audio."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from agent.config import ConversationSettings
from agent.ops.logs import context as log_context
from agent.ops.metrics import Metrics
from agent.realtime.reply import Reply
from media.vad import SpeechStopped

log = logging.getLogger(__name__)
BARGE_IN_POLL_S = 0.02  # one VAD frame


class Floor(Protocol):
    """What barge-in needs of the conversation: the settings that allow it (and after how
    much speech), the reply the caller hears, and cutting that reply off."""

    @property
    def settings(self) -> ConversationSettings: ...

    def audible_reply(self) -> Reply | None: ...

    def interrupt(self, reason: str, audio_end_ms: int | None = None) -> bool: ...


class CallerSpeech(Protocol):
    """The caller's speech in progress, as the call's VAD follows it."""

    @property
    def in_speech(self) -> bool: ...

    @property
    def voiced_ms(self) -> int: ...


class BargeIn:
    """The session's watch on the caller's speech over a reply it hears."""

    def __init__(self, floor: Floor, speech: CallerSpeech, metrics: Metrics,
                 call_id: str) -> None:
        self._floor, self._speech = floor, speech
        self._metrics, self._call_id = metrics, call_id
        self._watch: asyncio.Task[None] | None = None

    def onset(self) -> None:
        """The caller began to speak: watch it while a reply is audible, barge-in allowed."""
        reply = self._floor.audible_reply()
        if reply is None or not self._floor.settings.barge_in:
            return
        if self._in_echo_guard(reply):
            log.debug("call %s: onset ignored by echo guard", self._call_id)
            return
        if self._watch is None or self._watch.done():
            with log_context(turn_id=reply.turn_id):
                self._watch = asyncio.ensure_future(self._watch_speech(reply))

    def speech_ended(self, event: SpeechStopped) -> None:
        """The caller's speech ended before the watch saw it last long enough (audio sent
        faster than real time, as a WebSocket client may): long enough, it barges in all the
        same."""
        floor, watch = self._floor, self._watch
        if (watch is not None and not watch.done() and floor.audible_reply() is not None
                and event.audio_end_ms - event.audio_start_ms >= floor.settings.barge_in_min_ms):
            watch.cancel()
            self._barge_in()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()

    def _in_echo_guard(self, reply: Reply) -> bool:
        guard = self._floor.settings.echo_guard_ms
        if not guard or reply.first_audio_at is None:
            return False
        return (asyncio.get_running_loop().time() - reply.first_audio_at) * 1000 < guard

    async def _watch_speech(self, reply: Reply) -> None:
        """Interrupt `reply` once the caller's speech has lasted barge_in_min_ms."""
        floor, speech = self._floor, self._speech
        while speech.in_speech and floor.audible_reply() is reply:
            if speech.voiced_ms >= floor.settings.barge_in_min_ms:
                log.info("call %s: barge-in after %d ms of speech", self._call_id,
                         speech.voiced_ms)
                self._barge_in()
                return
            await asyncio.sleep(BARGE_IN_POLL_S)

    def _barge_in(self) -> None:
        """The caller's speech takes the floor: what the caller hears now is cut off."""
        self._metrics.barge_ins.inc()
        self._floor.interrupt("turn_detected")
