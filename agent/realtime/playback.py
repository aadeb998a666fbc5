"""The agent's audio on a call as Realtime events tell it: one `output_audio_buffer.started`
and one `stopped` per reply from the outbound audio's playing/idle edges, and cutting a reply
off (`cleared`, `conversation.item.truncated` at what the caller heard)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from agent.realtime.reply import Reply
from agent.realtime.server_events import (
    conversation_item_truncated,
    output_audio_buffer_cleared,
    output_audio_buffer_started,
    output_audio_buffer_stopped,
)
from agent.realtime.transport import CallTransport
from agent.realtime.turn_record import after_start_ms

log = logging.getLogger(__name__)


class Playback:
    """The output audio buffer's events of one session: it follows the call's outbound audio
    for the session's latest reply (`last_reply`), and says when a reply that ended has played
    out (`played_out`)."""

    def __init__(self, call: CallTransport, last_reply: Callable[[], Reply | None],
                 played_out: Callable[[], None]) -> None:
        self._call, self._last_reply, self._played_out = call, last_reply, played_out
        self._flushing = False
        call.outbound.on_playing_changed = self.on_playing_changed

    def silence(self, reply: Reply, audio_end_ms: int | None = None) -> None:
        """Flush the outbound track and report what the caller heard of `reply` (or, when the
        client says so, its first `audio_end_ms`); from now on that is all it heard."""
        outbound = self._call.outbound
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
            self._call.send_event(output_audio_buffer_cleared(reply.response_id))
        self._call.send_event(conversation_item_truncated(reply.item_id, played))

    def on_playing_changed(self, playing: bool) -> None:
        """Turn the track's playing/idle edges into one started and one stopped per reply; an
        idle edge while the reply is still generating is an underrun, not the end."""
        reply = self._last_reply()
        if reply is None or self._flushing:
            return
        if playing and reply.audio_state == "idle":
            reply.audio_state = "started"
            reply.first_frame_at = asyncio.get_running_loop().time()
            if reply.finished:  # recorded already, its audio all queued when it ended
                self._call.records.first_frame_sent(
                    reply.response_id, after_start_ms(reply, reply.first_frame_at))
            self._call.send_event(output_audio_buffer_started(reply.response_id))
        elif not playing and reply.finished:
            self.stopped(reply)
        elif not playing:
            reply.underruns += 1
            log.debug("call %s: underrun %d in %s", self._call.id, reply.underruns,
                      reply.response_id)

    def stopped(self, reply: Reply) -> None:
        """`reply`'s audio has all played: `output_audio_buffer.stopped`, once."""
        if reply.audio_state != "started":
            return
        reply.audio_state = "stopped"
        self._call.send_event(output_audio_buffer_stopped(reply.response_id))
        self._played_out()
