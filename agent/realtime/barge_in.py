"""Barge-in: the caller talking over the agent's reply cuts it off once the speech has lasted
barge_in_min_ms (a watch polls the VAD at each frame), unless it began inside the echo guard
just after the reply's first audio."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from agent.ops.logs import context as log_context
from agent.realtime.reply import Reply
from media.vad import SpeechStopped

if TYPE_CHECKING:
    from agent.realtime.session import Session

log = logging.getLogger(__name__)
BARGE_IN_POLL_S = 0.02  # one VAD frame


class BargeIn:
    """The session's watch on the caller's speech over a reply it hears."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._watch: asyncio.Task[None] | None = None

    def onset(self) -> None:
        """The caller began to speak: watch it while a reply is audible, barge-in allowed."""
        session = self.session
        reply = session.audible_reply()
        if reply is None or not session.settings.barge_in:
            return
        if self._in_echo_guard(reply):
            log.debug("call %s: onset ignored by echo guard", session.call.id)
            return
        if self._watch is None or self._watch.done():
            with log_context(turn_id=reply.turn_id):
                self._watch = asyncio.ensure_future(self._watch_speech(reply))

    def speech_ended(self, event: SpeechStopped) -> None:
        """The caller's speech ended before the watch saw it last long enough (audio sent
        faster than real time, as a WebSocket client may): long enough, it barges in all the
        same."""
        session, watch = self.session, self._watch
        if (watch is not None and not watch.done() and session.audible_reply() is not None
                and event.audio_end_ms - event.audio_start_ms >= session.settings.barge_in_min_ms):
            watch.cancel()
            session.call.metrics.barge_ins.inc()
            session.interrupt("turn_detected")

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()

    def _in_echo_guard(self, reply: Reply) -> bool:
        guard = self.session.settings.echo_guard_ms
        if not guard or reply.first_audio_at is None:
            return False
        return (asyncio.get_running_loop().time() - reply.first_audio_at) * 1000 < guard

    async def _watch_speech(self, reply: Reply) -> None:
        """Interrupt `reply` once the caller's speech has lasted barge_in_min_ms."""
        session = self.session
        vad = session.call.vad
        while vad.in_speech and session.audible_reply() is reply:
            if vad.voiced_ms >= session.settings.barge_in_min_ms:
                log.info("call %s: barge-in after %d ms of speech", session.call.id,
                         vad.voiced_ms)
                session.call.metrics.barge_ins.inc()
                session.interrupt("turn_detected")
                return
            await asyncio.sleep(BARGE_IN_POLL_S)
