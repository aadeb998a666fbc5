"""The conversation on one call: VAD turns (or the client's commits) drive the pipeline, replies
stream into the call, whatever carries it (realtime/transport.py), and the caller can cut the
agent off (barge-in) at any moment."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
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
from agent.realtime.reply import Reply, State, done_events
from agent.realtime.reply_events import on_pipeline_event
from agent.realtime.server_events import (
    assistant_item,
    conversation_item_added,
    input_audio_buffer_committed,
    input_audio_buffer_timeout_triggered,
    item_added_and_done,
    new_id,
    output_item_added,
    response_created,
    session_object,
    transcription_session_object,
    user_audio_item,
)
from agent.realtime.session_config import SavedConversation, SessionConfig
from agent.realtime.transcribing import transcribe
from agent.realtime.transport import AudioOutEnded, CallTransport
from agent.realtime.turn_record import turn_record
from agent.realtime.turn_taking.barge_in import BargeIn
from agent.realtime.turn_taking.idle_timeout import IdleTimeout
from agent.realtime.turn_taking.pauses import Pauses
from agent.realtime.turn_taking.preemptive import PreemptiveReply
from agent.realtime.turn_taking.semantic_turns import SemanticTurns
from agent.realtime.turn_taking.server_vad import ServerVadTurns, creates_responses
from agent.realtime.voices import spoken_voice
from media.vad import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped
from pipeline.turns.events import Turn

log = logging.getLogger(__name__)
UNANSWERED_MAX = 4  # committed utterances kept for the next reply (create_response=false)
TRACK_END_GRACE_S = 2.0  # for the peer connection's own close to end the call first


class Session:
    """Handler of one call's speech and client events (see agent.calls.call.CallHandler): the
    one owner of the call's live configuration, its replies and its history; when turns end,
    start early or are cut off is its turn-taking policies' to say (turn_taking/)."""

    def __init__(self, call: CallTransport, pipeline: Any, settings: ConversationSettings) -> None:
        self.call = call
        self.pipeline = pipeline
        # The OpenAI names this session used and what each meant here (aliases.py).
        self.aliases: dict[str, dict[str, str]] = {}
        # The live configuration, this session's alone: the call and its VAD are told of it
        # (apply), never asked for it back.
        voice = self.spoken(settings.voice)
        self._config = dataclasses.replace(
            call.start, conversation=settings.model_copy(update={"voice": voice}))
        if voice != settings.voice:
            self.aliased("voice", settings.voice, voice)
        self.conversation = Conversation(settings.instructions, settings.max_history_items)
        self.state = State.LISTENING
        self.reply: Reply | None = None
        self.cancelling: Reply | None = None  # cut off, its requests still being aborted
        self._last_reply: Reply | None = None
        self._turns = 0
        # The caller's committed utterances that no reply has heard yet (audio, not history).
        self._unanswered: deque[tuple[str, np.ndarray]] = deque(maxlen=UNANSWERED_MAX)
        self.client_events = ClientEvents(self)
        self.playback = Playback(call, lambda: self.last_reply, self._played_out)
        # Turn-taking, one policy each (turn_taking/), each told only what it needs.
        self.end_of_turn = ServerVadTurns(self, call.id)
        judge = SemanticTurns(lambda: self.settings.eagerness, call.end_utterance,
                              call.metrics, call.id)
        # The reply started at the caller's pause, if any.
        self.pauses = Pauses(self, judge, call.metrics, call.spawn, call.id)
        self.barge_in = BargeIn(self, call.metrics, call.id)
        self.idle = IdleTimeout(self._idle_expired)

    @property
    def config(self) -> SessionConfig:
        """The conversation, VAD and tool settings the session runs with now."""
        return self._config

    @property
    def settings(self) -> ConversationSettings:
        """The conversation's settings now (the live configuration's)."""
        return self._config.conversation

    @property
    def tools(self) -> SessionTools:
        """The functions the session declared, and its tool choice, now."""
        return self._config.tools

    def session_object(self) -> dict[str, Any]:
        if self.settings.transcription_only:
            return transcription_session_object(self.call.id, self.model_id, self.settings,
                                                self.config.vad)
        return session_object(
            self.call.id, self.model_id, self.settings, self.config.vad,
            self.tools.tools_field(), self.tools.choice_field(),
        )

    @property
    def model_id(self) -> str:
        """The model version the call talks to (`name@version`; a pin still to take over,
        once pinned), or the profile's name on a pipeline with no versions (a stand-in)."""
        return str(getattr(self.pipeline, "model_id", self.call.settings.profile))

    def spoken(self, voice: str) -> str:
        """The voice this call's model speaks when asked for `voice` (an alias resolved)."""
        settings = self.call.settings
        return spoken_voice(voice, self.pipeline, settings.aliases, settings.conversation.voice)

    def aliased(self, kind: str, asked: str, meant: str) -> None:
        """Keep (log, call record) that the session's `kind` name `asked` meant `meant` here."""
        if self.aliases.get(kind) == {"asked": asked, "resolved": meant}:
            return
        self.aliases[kind] = {"asked": asked, "resolved": meant}
        log.info("call %s: %s %r taken as %r (an alias)", self.call.id, kind, asked, meant)
        self.call.records.call_aliases(self.call.id, self.aliases)

    def serves(self, model_id: str) -> bool:
        """Whether `model_id` names a model version served here (the call's name or version
        on a pipeline with no versions, a stand-in)."""
        serves = getattr(self.pipeline, "serves", None)
        if serves is None:
            return model_id in (self.model_id, self.call.settings.profile)
        return bool(serves(model_id))

    def pin(self, model_id: str) -> None:
        """Talk to `model_id` from the next turn boundary (session.update); UnknownModelError
        (a ValueError) when it is not served."""
        pin = getattr(self.pipeline, "pin", None)
        if pin is None:
            raise ValueError(f"model: this server serves no model versions to pin {model_id!r}")
        pin(model_id)

    def apply(self, config: SessionConfig) -> None:
        """Run with `config` from now on (a `session.update` already checked): the one place
        the live configuration changes, and the call and its VAD are told."""
        self._config = config
        self.idle.disarm()  # armed again once the next reply has played out
        self.conversation.instructions = config.conversation.instructions
        self.call.run_with(config)

    def save(self) -> SavedConversation:
        """The conversation so far, for a caller who may come back (agent/calls/resume.py)."""
        return SavedConversation(self.conversation, self.config)

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
        self.idle.disarm()
        self.pauses.discard()  # a new utterance: what began at a pause is not its reply
        self.barge_in.onset()

    def on_speech_heard(self, voiced_ms: int) -> None:
        self.barge_in.heard(voiced_ms)

    def on_speech_stopped(self, event: SpeechStopped, item_id: str) -> None:
        self.barge_in.speech_ended(event)
        if not self.end_of_turn.is_turn(event):
            return
        self.commit(item_id, event.pcm)
        self.pauses.discard()  # not taken by the reply the commit started (if any)

    def on_speech_paused(self, event: SpeechPaused) -> None:
        self.pauses.paused(event)

    def on_speech_resumed(self, event: SpeechResumed) -> None:
        """The caller went on after a pause: the turn started there is not wanted."""
        self.pauses.discard()

    @property
    def unanswered(self) -> int:
        """The caller's committed utterances that no reply has heard yet."""
        return len(self._unanswered)

    def turn_at_pause(self, pcm: np.ndarray) -> Turn | None:
        """The turn a reply to `pcm` would run if the caller's utterance ended now (under the
        session's own modalities and tools); None when its end would start no reply."""
        if not self.end_of_turn.answers():
            return None
        return self.next_turn(pcm, self.settings.text_only, self.tools)

    def commit(self, item_id: str, pcm: np.ndarray) -> None:
        """The caller's utterance `pcm` (16 kHz) becomes a conversation item, answered now
        when the session creates responses itself."""
        self.call.send_event(input_audio_buffer_committed(item_id))
        self.conversation.add(item_id, "user", "", heard=True)
        # Final as committed, as OpenAI's: the transcript follows in its own events.
        for event in item_added_and_done(user_audio_item(item_id, None)):
            self.call.send_event(event)
        if self.settings.transcription_only:  # written down, never answered
            self.call.spawn(transcribe(self.pipeline, self.call, self.conversation, item_id, pcm))
            return
        self._unanswered.append((item_id, pcm))
        if creates_responses(self.settings):  # else: the client asks, response.create
            self.start_reply()

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

    def start_reply(self, text_only: bool | None = None, tools: SessionTools | None = None,
                    metadata: dict[str, str] | None = None) -> Reply:
        """Start a response to the conversation so far, hearing the caller's committed
        utterances that no reply has heard yet; in text alone if asked (else as the session
        says). With functions to call (the session's `tools`, or this response's), the Thinker
        answers in JSON first (tool_answers.py). `metadata`: the client's, given back."""
        if self.cancelling is not None:
            # Its response.done goes first, as the protocol orders them (LiveKit's plugin takes
            # any response.done for its current response); its aborts go on meanwhile.
            cut = self.cancelling
            self.finish(cut, "cancelled", reason=cut.cancel_reason, text=self.heard(cut))
        self.idle.disarm()
        audio, user_item_id = self._take_unanswered()
        text_only = self.settings.text_only if text_only is None else text_only
        tools = self.tools if tools is None else tools
        turn = self.next_turn(audio, text_only, tools)
        preemptive = self.pauses.take(turn)
        if preemptive is not None:
            turn = preemptive.turn  # already under way since the caller's pause
        reply = Reply(
            response_id=new_id("resp"),
            item_id=new_id("item"),
            turn_id=turn.turn_id,
            user_item_id=user_item_id,
            text_only=text_only,
            metadata=metadata,
            started_at=asyncio.get_running_loop().time(),
            answers_in_json=turn.response_format is not None,
        )
        self.reply = reply
        self.state = State.THINKING
        self.call.send_event(response_created(reply.response_id, reply.text_only,
                                              reply.metadata))
        if not reply.answers_in_json:
            self.announce(reply)
        with log_context(turn_id=reply.turn_id):  # the reply's tasks log as its turn's
            reply.task = asyncio.ensure_future(self._run(reply, turn, preemptive))
        return reply

    def next_turn(self, audio: np.ndarray | None, text_only: bool, tools: SessionTools) -> Turn:
        """The pipeline turn that answers the conversation so far (and `audio`) now, under the
        call's next turn id."""
        self._turns += 1
        turn_id = f"{self.call.id}-turn{self._turns}"
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
            truncation=self.settings.truncation,
        )

    def announce(self, reply: Reply) -> None:
        """The reply's message item joins the history and goes to the client, empty."""
        reply.announced = True
        self.conversation.add(reply.item_id, "assistant", "")
        item = assistant_item(reply.item_id, "", "in_progress", reply.text_only)
        self.call.send_event(output_item_added(reply.response_id, item))
        self.call.send_event(conversation_item_added(item))

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
                    await on_pipeline_event(self, reply, event)
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
        if self.cancelling is reply:
            self.cancelling = None
        self.call.metrics.turn_ended(status, reply.usage)
        transcript = reply.text if text is None else text
        item = self.conversation.get(reply.item_id)
        if item is not None:
            item.text = transcript
        # Recorded before response.done goes out: whoever saw that event finds the turn.
        self.call.records.add_turn(turn_record(self.call.id, reply, self.conversation, status,
                                               transcript, error=error, reason=reason))
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
        if self.reply is None and not audible:
            self.fell_silent()

    def _played_out(self) -> None:
        """A reply's audio has all played (playback.py): with none under way, the agent is
        silent and listening."""
        if self.reply is None:
            self.state = State.LISTENING
            self.fell_silent()

    def fell_silent(self) -> None:
        """The agent's last reply has played out: the caller's idle time starts."""
        if self.settings.server_vad:
            self.idle.arm(self.settings.idle_timeout_ms)

    def _idle_expired(self, idle_ms: int) -> None:
        """The caller stayed silent `idle_ms` after the agent: say so, and answer anyway."""
        if self.reply is not None or self.call.vad.in_speech or self.audible_reply():
            return
        item_id, end_ms = new_id("item"), self.call.vad.position_ms
        self.call.send_event(input_audio_buffer_timeout_triggered(
            item_id, max(0, end_ms - idle_ms), end_ms))
        self.conversation.add(item_id, "user", "", heard=True)
        for event in item_added_and_done(user_audio_item(item_id, "")):
            self.call.send_event(event)
        self.start_reply()

    def cancel_reply(
        self, reason: str = "client_cancelled", audio_end_ms: int | None = None
    ) -> bool:
        """Stop the reply in flight. The call goes silent and the reply is detached before this
        returns, so the next client event already finds no active response; a call task then
        aborts its requests and sends response.done (the engines hold nothing of it by then)."""
        reply = self.reply
        if reply is None:
            return False
        self.reply, self.cancelling = None, reply
        reply.cancel_reason = reason
        self.state = State.LISTENING
        self.playback.silence(reply, audio_end_ms)
        self.call.metrics.cancels.labels(reason).inc()
        with log_context(turn_id=reply.turn_id):
            self.call.spawn(self._abort(reply))
        return True

    async def _abort(self, reply: Reply) -> None:
        await self.pipeline.cancel(reply.turn_id)
        if reply.task is not None and reply.task is not asyncio.current_task():
            reply.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reply.task
        self.finish(reply, "cancelled", reason=reply.cancel_reason, text=self.heard(reply))

    async def aclose(self) -> None:
        self.idle.disarm()
        self.barge_in.close()
        await self.pauses.aclose()
        if self.reply is not None:
            reply, self.reply = self.reply, None
            self.call.metrics.turn_ended("cancelled", None)  # the call hung up mid-reply
            self.call.records.add_turn(turn_record(self.call.id, reply, self.conversation,
                                                   "cancelled", self.heard(reply),
                                                   reason="call_ended"))
            await self.pipeline.cancel(reply.turn_id)
            if reply.task is not None:
                reply.task.cancel()
        release = getattr(self.pipeline, "release", None)
        if release is not None:  # the call no longer holds its model version
            release()
