"""The conversation on one call: VAD turns (or the client's commits) drive the pipeline, replies
stream into the call, whatever carries it (realtime/transport.py), and the caller can cut the
agent off (barge-in) at any moment."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any

import numpy as np

from agent.config import ConversationSettings
from agent.ops.logs import context as log_context
from agent.realtime.client_events import ClientEvents
from agent.realtime.function_calls import SessionTools
from agent.realtime.history import Conversation
from agent.realtime.playback import Playback
from agent.realtime.preemptive import PreemptiveReply
from agent.realtime.reply import Reply, State, done_events
from agent.realtime.semantic_turns import ends_turn
from agent.realtime.server_events import (
    assistant_item,
    conversation_item_created,
    input_audio_buffer_committed,
    input_audio_transcription_completed,
    new_id,
    output_audio_transcript_delta,
    output_item_added,
    output_text_delta,
    response_created,
    session_object,
    usage_object,
    user_audio_item,
)
from agent.realtime.session_config import SavedConversation, SessionConfig
from agent.realtime.tool_answers import answered, merged_usage
from agent.realtime.transport import AudioOutEnded, CallTransport
from media.vad import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped
from pipeline.events import AudioChunk, TextDelta, Transcript, Turn, TurnDone, TurnFailed

log = logging.getLogger(__name__)
BARGE_IN_POLL_S = 0.02  # one VAD frame
UNANSWERED_MAX = 4  # committed utterances kept for the next reply (create_response=false)
TRACK_END_GRACE_S = 2.0  # for the peer connection's own close to end the call first


class Session:
    """Handler of one call's speech and client events (see agent.calls.call.CallHandler)."""

    def __init__(self, call: CallTransport, pipeline: Any, settings: ConversationSettings) -> None:
        self.call = call
        self.pipeline = pipeline
        self.settings = settings.model_copy()
        self.tools = call.tools
        self.conversation = Conversation(settings.instructions, settings.max_history_items)
        self.state = State.LISTENING
        self.reply: Reply | None = None
        self._last_reply: Reply | None = None
        self._barge_in_watch: asyncio.Task[None] | None = None
        self._preemptive: PreemptiveReply | None = None  # started at the caller's pause
        self._turns = 0
        # The caller's committed utterances that no reply has heard yet (audio, not history).
        self._unanswered: deque[tuple[str, np.ndarray]] = deque(maxlen=UNANSWERED_MAX)
        self.client_events = ClientEvents(self)
        self.playback = Playback(self)

    def session_object(self) -> dict[str, Any]:
        return session_object(
            self.call.id, self.model_id, self.settings, self.call.vad.config,
            self.tools.tools_field(), self.tools.choice_field(),
        )

    @property
    def model_id(self) -> str:
        """The model version the call talks to (`name@version`; a pin still to take over,
        once pinned), or the profile's name on a pipeline with no versions (a stand-in)."""
        return str(getattr(self.pipeline, "model_id", self.call.settings.profile))

    def pin(self, model_id: str) -> None:
        """Talk to `model_id` from the next turn boundary (session.update); UnknownModelError
        (a ValueError) when it is not served."""
        pin = getattr(self.pipeline, "pin", None)
        if pin is None:
            raise ValueError(f"model: this server serves no model versions to pin {model_id!r}")
        pin(model_id)

    def config(self) -> SessionConfig:
        """The conversation, VAD and tool settings the call runs with now."""
        return SessionConfig(self.settings, self.call.vad.config, self.tools)

    def apply(self, config: SessionConfig) -> None:
        """Run with `config` from now on (a `session.update` already checked)."""
        self.settings, self.tools = config.conversation, config.tools
        self.conversation.instructions = config.conversation.instructions
        self.call.server_vad = config.conversation.server_vad
        if config.vad != self.call.vad.config:
            self.call.vad.reconfigure(config.vad)

    def save(self) -> SavedConversation:
        """The conversation so far, for a caller who may come back (agent/calls/resume.py)."""
        return SavedConversation(self.conversation, self.config())

    def resume(self, history: Conversation) -> None:
        """Go on with a dropped call's history (its settings came with the call, which started
        with them: agent/calls/call.py)."""
        history.instructions = self.settings.instructions
        self.conversation = history

    def on_client_event(self, event: Any) -> None:
        self.client_events.dispatch(event)

    @property
    def previous_reply(self) -> Reply | None:
        """The last reply that ended (the one in flight, if any, is `reply`)."""
        return self._last_reply

    @property
    def last_reply(self) -> Reply | None:
        """The reply in flight, else the last one that ended."""
        return self.reply or self._last_reply

    # -- caller speech ------------------------------------------------------------------

    def audible_reply(self) -> Reply | None:
        """The reply the caller is hearing or about to hear: still generating, or generated
        and still playing out of the outbound queue."""
        if self.reply is not None:
            return self.reply
        last, outbound = self._last_reply, self.call.outbound
        if last is not None and (outbound.playing or outbound.queued_ms > 0):
            return last
        return None

    def on_speech_started(self, event: SpeechStarted, item_id: str) -> None:
        self._discard_preemptive()  # a new utterance: what began at a pause is not its reply
        reply = self.audible_reply()
        if reply is None or not self.settings.barge_in:
            return
        if self._in_echo_guard(reply):
            log.debug("call %s: onset ignored by echo guard", self.call.id)
            return
        if self._barge_in_watch is None or self._barge_in_watch.done():
            with log_context(turn_id=reply.turn_id):
                self._barge_in_watch = asyncio.ensure_future(self._watch_barge_in(reply))

    def on_speech_stopped(self, event: SpeechStopped, item_id: str) -> None:
        watch = self._barge_in_watch
        if (watch is not None and not watch.done() and self.audible_reply() is not None
                and event.audio_end_ms - event.audio_start_ms >= self.settings.barge_in_min_ms):
            # Over before the watch saw it last long enough (audio sent faster than real time,
            # as a WebSocket client may): it barges in all the same.
            watch.cancel()
            self.call.metrics.barge_ins.inc()
            self.interrupt("turn_detected")
        if self.audible_reply() is not None:
            # Too short to barge in (or barge-in is off): not a turn of its own.
            log.info(
                "call %s: %d ms of caller audio during a reply ignored",
                self.call.id,
                event.audio_end_ms - event.audio_start_ms,
            )
            return
        self.commit(item_id, event.pcm)
        self._discard_preemptive()  # not taken by the reply the commit started (if any)

    def on_speech_paused(self, event: SpeechPaused) -> None:
        """The caller paused: when a reply would start on this utterance if the pause turned
        out to end it, start its turn now and hold what it makes until the turn is confirmed."""
        if (self._preemptive is not None or self.audible_reply() is not None
                or self._unanswered or not (self.settings.create_response
                                            and self.settings.server_vad)):
            return
        self._turns += 1
        turn_id = f"{self.call.id}-turn{self._turns}"
        turn = self._turn(turn_id, event.pcm, self.settings.text_only, self.tools)
        with log_context(turn_id=turn_id):
            self._preemptive = PreemptiveReply(self.pipeline, turn, self._judge_pause)
        self.call.metrics.preemptive_replies.labels("started").inc()
        log.debug("call %s: preemptive turn %s at a %d ms pause", self.call.id, turn_id,
                  self.call.vad.config.pause_ms)

    def _judge_pause(self, preemptive: PreemptiveReply, heard: Transcript) -> None:
        """semantic_vad: end the turn at this pause when the Thinker scored the caller's words
        as a whole turn (its reply is then the one under way), else let the silence decide."""
        eagerness = self.settings.eagerness
        if eagerness is None or preemptive is not self._preemptive:
            return
        ended = ends_turn(eagerness, heard.end_of_turn) and self.call.end_utterance()
        self.call.metrics.semantic_turn_ends.labels("ended" if ended else "waited").inc()
        log.info("call %s: %r scored %s as a whole turn: %s", self.call.id, heard.text,
                 "unscored" if heard.end_of_turn is None else f"{heard.end_of_turn:.2f}",
                 "turn ended at the pause" if ended else "waiting")

    def on_speech_resumed(self, event: SpeechResumed) -> None:
        """The caller went on after a pause: the turn started there is not wanted."""
        self._discard_preemptive()

    def _discard_preemptive(self) -> None:
        preemptive, self._preemptive = self._preemptive, None
        if preemptive is not None:
            self.call.metrics.preemptive_replies.labels("discarded").inc()
            with log_context(turn_id=preemptive.turn.turn_id):
                self.call.spawn(preemptive.discard())

    def commit(self, item_id: str, pcm: np.ndarray) -> None:
        """The caller's utterance `pcm` (16 kHz) becomes a conversation item, answered now
        when the session creates responses itself."""
        self.call.send_event(input_audio_buffer_committed(item_id))
        self.conversation.add(item_id, "user", "")
        self.call.send_event(conversation_item_created(user_audio_item(item_id, None)))
        self._unanswered.append((item_id, pcm))
        if self.settings.create_response and self.settings.server_vad:  # else: response.create
            self.start_reply()

    def _in_echo_guard(self, reply: Reply) -> bool:
        guard = self.settings.echo_guard_ms
        if not guard or reply.first_audio_at is None:
            return False
        return (asyncio.get_running_loop().time() - reply.first_audio_at) * 1000 < guard

    async def _watch_barge_in(self, reply: Reply) -> None:
        """Interrupt `reply` once the caller's speech has lasted barge_in_min_ms."""
        vad = self.call.vad
        while vad.in_speech and self.audible_reply() is reply:
            if vad.voiced_ms >= self.settings.barge_in_min_ms:
                log.info("call %s: barge-in after %d ms of speech", self.call.id, vad.voiced_ms)
                self.call.metrics.barge_ins.inc()
                self.interrupt("turn_detected")
                return
            await asyncio.sleep(BARGE_IN_POLL_S)

    def interrupt(self, reason: str, audio_end_ms: int | None = None) -> bool:
        """Silence whatever the caller hears now: cancel a reply still generating, or cut the
        played-out tail of a finished one (its history entry keeps only what was heard, or the
        first `audio_end_ms` when the client says how much it heard)."""
        if self.reply is not None:
            return self.cancel_reply(reason, audio_end_ms)
        reply = self.audible_reply()
        if reply is None:
            return False
        self.playback.silence(reply, audio_end_ms)
        item = self.conversation.get(reply.item_id)
        if item is not None:
            item.text = self.heard(reply)
        self.state = State.LISTENING
        return True

    def heard(self, reply: Reply) -> str:
        """The part of `reply` the caller heard: its text up to the audio played out."""
        return reply.spoken.heard(reply.text, reply.played_ms(self.call.outbound.played_ms))

    # -- replies --------------------------------------------------------------------------

    def start_reply(self, text_only: bool | None = None,
                    tools: SessionTools | None = None) -> Reply:
        """Start a response to the conversation so far, hearing the caller's committed
        utterances that no reply has heard yet; in text alone if asked (else as the session
        says). With functions to call (the session's `tools`, or this response's), the Thinker
        answers in JSON first (tool_answers.py)."""
        audio, user_item_id = self._take_unanswered()
        text_only = self.settings.text_only if text_only is None else text_only
        tools = self.tools if tools is None else tools
        self._turns += 1
        turn = self._turn(f"{self.call.id}-turn{self._turns}", audio, text_only, tools)
        preemptive, self._preemptive = self._preemptive, None
        if preemptive is not None and preemptive.serves(turn):
            turn = preemptive.turn  # already under way since the caller's pause
            self.call.metrics.preemptive_replies.labels("used").inc()
        elif preemptive is not None:
            self._preemptive = preemptive  # the caller's next words or the close discard it
            self._discard_preemptive()
            preemptive = None
        reply = Reply(
            response_id=new_id("resp"),
            item_id=new_id("item"),
            turn_id=turn.turn_id,
            user_item_id=user_item_id,
            text_only=text_only,
            started_at=asyncio.get_running_loop().time(),
            answers_in_json=turn.response_format is not None,
        )
        self.reply = reply
        self.state = State.THINKING
        self.call.send_event(response_created(reply.response_id, reply.text_only))
        if not reply.answers_in_json:
            self.announce(reply)
        with log_context(turn_id=reply.turn_id):  # the reply's tasks log as its turn's
            reply.task = asyncio.ensure_future(self._run(reply, turn, preemptive))
        return reply

    def _turn(self, turn_id: str, audio: np.ndarray | None, text_only: bool,
              tools: SessionTools) -> Turn:
        """The pipeline turn that answers the conversation so far (and `audio`) now."""
        answer_format = tools.answer_format()
        messages = self.conversation.messages()
        in_json = answer_format is not None
        return Turn(
            turn_id=turn_id,
            call_id=self.call.id,
            messages=tools.thinker_messages(messages) if in_json else messages,
            audio=audio,
            max_tokens=self.settings.max_reply_tokens,
            voice=self.settings.voice,
            response_format=answer_format,
            speak=not text_only and not in_json,
            score_end_of_turn=self.settings.eagerness is not None and audio is not None,
        )

    def announce(self, reply: Reply) -> None:
        """The reply's message item joins the history and goes to the client, empty."""
        reply.announced = True
        self.conversation.add(reply.item_id, "assistant", "")
        item = assistant_item(reply.item_id, "", "in_progress", reply.text_only)
        self.call.send_event(output_item_added(reply.response_id, item))
        self.call.send_event(conversation_item_created(item))

    def _take_unanswered(self) -> tuple[np.ndarray | None, str | None]:
        """The unanswered utterances as one audio, and the item the transcript belongs to."""
        if not self._unanswered:
            return None, None
        items = list(self._unanswered)
        self._unanswered.clear()
        if len(items) == 1:
            return items[0][1], items[0][0]
        return np.concatenate([pcm for _, pcm in items]), items[-1][0]

    async def _run(self, reply: Reply, turn: Turn,
                   preemptive: PreemptiveReply | None = None) -> None:
        """Run the reply's turn (or read on the one its preemptive start has under way), and
        the follow-up that voices an answer read from JSON."""
        held = preemptive
        try:
            next_turn: Turn | None = turn
            while next_turn is not None:
                events = (preemptive.events() if preemptive is not None
                          else self.pipeline.respond(next_turn))
                preemptive = None
                async for event in events:
                    if self.reply is not reply:
                        return
                    await self._on_pipeline_event(reply, event)
                next_turn, reply.follow_up = reply.follow_up, None
        except asyncio.CancelledError:
            raise
        except AudioOutEnded:
            # The connection closed before the call heard of it: the caller is gone, so the
            # call's close (aclose) records this reply as cut by the call's end and aborts it.
            log.info("call %s: the outgoing audio ended mid-reply", self.call.id)
            self.call.spawn(self._end_call_without_track())
        except Exception as exc:  # the pipeline's own failures arrive as TurnFailed
            log.exception("call %s: reply %s broke", self.call.id, reply.response_id)
            self.finish(reply, "failed", error=str(exc))
        finally:
            if held is not None:  # a cancelled reply's pump must not wait on a full queue
                held.stop()

    async def _end_call_without_track(self) -> None:
        """End the call if its own close does not come soon: audio that stopped for any other
        reason leaves a call that can no longer speak. (Closing cancels this task.)"""
        await asyncio.sleep(TRACK_END_GRACE_S)
        await self.call.end("media_failed", "the call's outgoing audio ended")

    async def _on_pipeline_event(self, reply: Reply, event: Any) -> None:
        if isinstance(event, TextDelta):
            reply.text += event.text
            if reply.answers_in_json:
                return  # read whole at the end (tool_answers.py)
            delta = output_text_delta if reply.text_only else output_audio_transcript_delta
            self.call.send_event(delta(reply.response_id, reply.item_id, event.text))
        elif isinstance(event, AudioChunk) and not reply.text_only:
            await self._play(reply, event)
        elif isinstance(event, Transcript):
            self._user_transcript(reply, event.text)
        elif isinstance(event, TurnDone) and reply.answers_in_json:
            answered(self, reply, event)
        elif isinstance(event, TurnDone):
            reply.text = event.text
            reply.usage = merged_usage(reply.usage, event.usage)
            self.finish(reply, "completed", usage=usage_object(reply.usage))
        elif isinstance(event, TurnFailed):
            self.finish(reply, "failed", error=str(event.error))

    async def _play(self, reply: Reply, chunk: AudioChunk) -> None:
        outbound = self.call.outbound
        if reply.audio_base_ms is None:
            reply.audio_base_ms = outbound.played_ms + outbound.queued_ms
            reply.first_audio_at = asyncio.get_running_loop().time()
            self.state = State.SPEAKING
            self.call.metrics.first_audio(reply.first_audio_at - reply.started_at)
            log.info(
                "call %s: first audio %.0f ms after the turn began",
                self.call.id,
                (reply.first_audio_at - reply.started_at) * 1000,
            )
        duration_ms = len(chunk.pcm) * 1000 // chunk.sample_rate
        reply.spoken.add_chunk(duration_ms, chunk.text_start, chunk.text_end)
        await self.call.play(reply.response_id, reply.item_id, chunk.pcm, chunk.sample_rate)

    def _user_transcript(self, reply: Reply, text: str) -> None:
        if reply.user_item_id is None:
            return
        item = self.conversation.get(reply.user_item_id)
        if item is not None:
            item.text = text
        self.call.send_event(input_audio_transcription_completed(reply.user_item_id, text))

    def finish(
        self,
        reply: Reply,
        status: str,
        usage: dict[str, Any] | None = None,
        error: str | None = None,
        reason: str | None = None,
        text: str | None = None,
    ) -> None:
        """Close a reply: history, the done events, and back to listening."""
        if reply.finished:
            return
        reply.finished = True
        self.call.metrics.turn_ended(status, reply.usage)
        transcript = reply.text if text is None else text
        item = self.conversation.get(reply.item_id)
        if item is not None:
            item.text = transcript
        # Recorded before response.done goes out: whoever saw that event finds the turn.
        self.call.records.turn_ended(self.call.id, reply, self.conversation, status, transcript,
                                     error=error, reason=reason)
        for event in done_events(reply, status, transcript, usage, error, reason):
            self.call.send_event(event)
        # A cancelled reply finishes after its aborts: by then a newer one may have ended.
        if self._last_reply is None or self._last_reply.started_at <= reply.started_at:
            self._last_reply = reply
        # Queued audio is still to be heard: after an underrun (the cascade behind playback) the
        # track is idle with the last chunk just queued; the idle edge at its end says stopped.
        audible = self.call.outbound.playing or self.call.outbound.queued_ms > 0
        if self.reply is reply:
            self.reply = None
            self.state = State.SPEAKING if audible else State.LISTENING
        if status == "completed" and not audible:
            self.playback.stopped(reply)

    def cancel_reply(
        self, reason: str = "client_cancelled", audio_end_ms: int | None = None
    ) -> bool:
        """Stop the reply in flight. The call goes silent and the reply is detached before this
        returns, so the next client event already finds no active response; a call task then
        aborts its requests and sends response.done (the engines hold nothing of it by then)."""
        reply = self.reply
        if reply is None:
            return False
        self.reply = None
        self.state = State.LISTENING
        self.playback.silence(reply, audio_end_ms)
        self.call.metrics.cancels.labels(reason).inc()
        with log_context(turn_id=reply.turn_id):
            self.call.spawn(self._abort(reply, reason))
        return True

    async def _abort(self, reply: Reply, reason: str) -> None:
        await self.pipeline.cancel(reply.turn_id)
        if reply.task is not None and reply.task is not asyncio.current_task():
            reply.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reply.task
        self.finish(reply, "cancelled", reason=reason, text=self.heard(reply))

    async def aclose(self) -> None:
        if self._barge_in_watch is not None:
            self._barge_in_watch.cancel()
        if self._preemptive is not None:
            preemptive, self._preemptive = self._preemptive, None
            await preemptive.discard()
        if self.reply is not None:
            reply, self.reply = self.reply, None
            self.call.metrics.turn_ended("cancelled", None)  # the call hung up mid-reply
            self.call.records.turn_ended(self.call.id, reply, self.conversation, "cancelled",
                                         self.heard(reply), reason="call_ended")
            await self.pipeline.cancel(reply.turn_id)
            if reply.task is not None:
                reply.task.cancel()
        release = getattr(self.pipeline, "release", None)
        if release is not None:  # the call no longer holds its model version
            release()
