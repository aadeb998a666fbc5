"""The agent's audio on a call as Realtime events tell it: one `output_audio_buffer.started`
and one `stopped` per reply from the outbound audio's playing/idle edges, and cutting a reply
off (`cleared`, `conversation.item.truncated` at what the caller heard)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from agent.realtime.reply import Reply, State
from agent.realtime.server_events import (
    conversation_item_truncated,
    output_audio_buffer_cleared,
    output_audio_buffer_started,
    output_audio_buffer_stopped,
)

if TYPE_CHECKING:
    from agent.realtime.session import Session

log = logging.getLogger(__name__)


class Playback:
    """The output audio buffer's events of one session."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._flushing = False
        session.call.outbound.on_playing_changed = self.on_playing_changed

    def silence(self, reply: Reply, audio_end_ms: int | None = None) -> None:
        """Flush the outbound track and report what the caller heard of `reply` (or, when the
        client says so, its first `audio_end_ms`); from now on that is all it heard."""
        outbound = self.session.call.outbound
        self._flushing = True  # the flush's playing->False is a clear, not a stop
        try:
            outbound.flush()
        finally:
            self._flushing = False
        played = reply.played_ms(outbound.played_ms) if audio_end_ms is None else audio_end_ms
        reply.cut_ms = played
        if reply.audio_base_ms is None:
            return
        if reply.audio_state == "started":
            reply.audio_state = "cleared"
            self.session.call.send_event(output_audio_buffer_cleared(reply.response_id))
        self.session.call.send_event(conversation_item_truncated(reply.item_id, played))

    def on_playing_changed(self, playing: bool) -> None:
        """Turn the track's playing/idle edges into one started and one stopped per reply; an
        idle edge while the reply is still generating is an underrun, not the end."""
        reply = self.session.last_reply
        if reply is None or self._flushing:
            return
        if playing and reply.audio_state == "idle":
            reply.audio_state = "started"
            reply.first_frame_at = asyncio.get_running_loop().time()
            if reply.finished:  # recorded already, its audio all queued when it ended
                self.session.call.records.first_frame_sent(reply)
            self.session.call.send_event(output_audio_buffer_started(reply.response_id))
        elif not playing and reply.finished:
            self.stopped(reply)
        elif not playing:
            reply.underruns += 1
            log.debug("call %s: underrun %d in %s", self.session.call.id, reply.underruns,
                      reply.response_id)

    def stopped(self, reply: Reply) -> None:
        if reply.audio_state != "started":
            return
        reply.audio_state = "stopped"
        self.session.call.send_event(output_audio_buffer_stopped(reply.response_id))
        if self.session.reply is None:
            self.session.state = State.LISTENING
            self.session.fell_silent()
