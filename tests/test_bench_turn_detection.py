"""`omnivox bench calls --turn-detection semantic_vad --eagerness high`: the callers ask for it in
their session, the server's session takes it, and each turn carries the server's stamps of
where its time to first audio went (agent/bench/turn_stamps.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from agent.bench.call_script import connect_call, run_call, session_update
from agent.bench.level import Plan
from agent.bench.speech import read_wav, utterance_wavs
from agent.cli import parse_args
from tests.conftest import wait_idle
from tests.served import Served


def test_the_options_reach_the_callers_session_update() -> None:
    args = parse_args(["bench", "calls", "--turn-detection", "semantic_vad",
                       "--eagerness", "high"])
    assert (args.turn_detection, args.eagerness) == ("semantic_vad", "high")
    plan = Plan(url="", concurrency=1, speech=("x.wav",), turn_detection="semantic_vad",
                eagerness="high", reply_tokens=12)
    assert session_update(plan) == {"type": "session.update", "session": {
        "type": "realtime", "max_output_tokens": 12,
        "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}}}
    assert session_update(Plan(url="", concurrency=1, speech=("x.wav",))) is None
    with pytest.raises(ValueError, match="eagerness"):
        Plan(url="", concurrency=1, speech=("x.wav",), turn_detection="server_vad",
             eagerness="high")


@pytest.mark.engines
async def test_a_semantic_vad_call_is_timed_with_the_servers_stamps(
        tiny_server: Served, tmp_path: Path) -> None:
    """One caller of a semantic_vad-high plan on the shared tiny server: the server's session
    says semantic_vad high, the turn is answered, and its stamps line up on the caller's
    timeline (the tiny family does not score words, so high's 800 ms silence ends the turn)."""
    speech = utterance_wavs(["Hello there."], tmp_path)
    plan = Plan(url=tiny_server.url, concurrency=1, speech=speech, turns=1, pause_s=0.1,
                barge_in_every=0, reply_tokens=12, turn_detection="semantic_vad",
                eagerness="high")
    caller, info = await connect_call(0, plan, asyncio.Semaphore(1))
    assert caller is not None, info
    assert (info["turn_detection"], info["eagerness"], info["silence_ms"]) == (
        "semantic_vad", "high", None)
    session = tiny_server.app.state.calls.get(caller.call_id).handler
    assert session.settings.eagerness == "high"
    emitted: list[tuple[str, Any]] = []
    record = await run_call(0, caller, plan, [read_wav(speech[0])[0]], time.monotonic(),
                            emitted.append)
    await wait_idle(tiny_server)
    turns = [item for kind, item in emitted if kind == "turn"]
    assert record["turns_ok"] == 1 and turns[0]["ok"], turns
    stamps = next(item for kind, item in emitted if kind == "stamps")["turns"]
    assert [s["turn"] for s in stamps] == [1], stamps
    went, ttfa = stamps[0], turns[0]["ttfa_ms"]
    assert went["turn_began_ms"] > 600, went  # high's 800 ms silence, less the VAD's tail
    assert went["turn_began_ms"] <= went["first_audio_queued_ms"] <= went["first_frame_sent_ms"]
    assert went["first_frame_sent_ms"] <= ttfa + 50, (went, ttfa)
    assert 0 < went["thinker_first_token_ms"] <= went["voicebox_first_chunk_ms"], went
    assert isinstance(went["underruns"], int) and went["underruns"] >= 0, went  # the record's
    assert set(went["longest_wait_ms"]) == {"thinker", "talker", "voicebox"}, went
