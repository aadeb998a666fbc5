"""A SIP phone on the `local` profile hears what the agent said: SIPp (tests/sip_phone.py) calls
through `omnivox sip` into the shared local server (Whisper tiny.en, SmolLM2, Piper), asks one
spoken question and records the G.711 the bridge sends it; the recording, transcribed by the
local family's own Whisper, must read back the reply text the server recorded for the call (its
`response.output_audio_transcript.done`, watched on the call's sideband WebSocket).

The word-error-rate bound is one a correct relay meets (measured: 0.0 through G.711 at 8 kHz)
and a broken one does not: the same packets played as they came, G.711 bytes taken for linear
samples (what a relay that forgot to decode would play), are checked to fail it; silence reads
as nothing (WER 1). Whisper is forgiving: the wrong G.711 law (PCMA for PCMU) still reads back
word for word, so it is no test of the bound.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect

from agent.bench.asr_score import word_error_rate
from agent.bench.speech import resample
from pipeline.families.kit.speech_recognizer import RecognizerSettings, SpeechRecognizer
from pipeline.families.local.build import ASR_DIR, FAMILY
from tests.conftest import local_models_dir
from tests.product_calls import wait_until
from tests.served import Served
from tests.sip_phone import (
    LOUD,
    phone_speech,
    recording_rtp,
    running_bridge,
    sipp_call,
    sipp_result,
)

pytestmark = pytest.mark.engines

QUESTION = "What is the capital of France?"
PHONE_RATE = 8_000
MAX_WER = 0.25  # a correct relay: 0.0 measured; its packets out of order: see out_of_order
PACKET = PHONE_RATE // 50  # samples in one 20 ms G.711 packet


async def test_the_phone_hears_what_the_agent_said(local_server: Served, tmp_path: Path) -> None:
    phone_speech(QUESTION, tmp_path)
    async with (running_bridge(local_server.url) as bridge,
                recording_rtp() as (sink, heard),
                sipp_call("server_hangs_up.xml", bridge, tmp_path, sink) as sipp):
        await wait_until(lambda: bool(list(local_server.app.state.calls)), 30, "the call")
        call_id = next(iter(local_server.app.state.calls)).id
        async with connect(local_server.url.replace("http://", "ws://")
                           + f"/v1/realtime?call_id={call_id}") as sideband:
            said = await asyncio.wait_for(played_reply(sideband), 90)
        await asyncio.sleep(0.5)  # the last packets are on their way to the phone
        async with httpx.AsyncClient(base_url=local_server.url) as http:
            assert (await http.post(f"/v1/realtime/calls/{call_id}/hangup")).status_code == 204
        rc, out = await sipp_result(sipp, 30)
    assert rc == 0, out  # the phone got the server's BYE through the bridge
    whisper = SpeechRecognizer(local_models_dir() / FAMILY / ASR_DIR, RecognizerSettings())
    phone = heard.audio()
    transcript = await asyncio.to_thread(whisper.transcribe, to_whisper(phone))
    garbled = await asyncio.to_thread(whisper.transcribe, to_whisper(out_of_order(phone)))
    error = word_error_rate([said], [transcript])
    print(f"\n[sip-local] the agent said: {said!r}\n[sip-local] the phone heard "
          f"{len(phone) / PHONE_RATE:.1f} s, Whisper read: {transcript!r}, WER {error:.3f}"
          f"\n[sip-local] its packets out of order: {garbled!r}")
    assert "paris" in said.lower(), said  # the question was understood and answered
    assert error <= MAX_WER, (said, transcript)
    assert word_error_rate([said], [garbled]) > MAX_WER, garbled  # the bound tells them apart


async def played_reply(sideband: ClientConnection) -> str:
    """The text of the call's first reply, once its audio has played out to its end."""
    said = ""
    async for message in sideband:
        event: dict[str, Any] = json.loads(message)
        if event["type"] == "response.output_audio_transcript.done":
            said = event["transcript"]
        elif event["type"] == "output_audio_buffer.stopped" and said:
            return said
        elif event["type"] == "error":
            raise AssertionError(f"the call failed: {event}")
    raise AssertionError("the sideband closed before the reply played out")


def out_of_order(audio: np.ndarray) -> np.ndarray:
    """The phone's audio with its 20 ms packets in a fixed random order: a broken relay's
    garbled audio (one that ignores RTP sequence numbers). The earlier control, G.711 bytes
    taken for 8-bit linear samples, kept each sample's sign, and sign alone is intelligible:
    Whisper read "The capital of France is yours." for "... Paris." in one CI run."""
    packets = audio[:len(audio) // PACKET * PACKET].reshape(-1, PACKET)
    return packets[np.random.default_rng(7).permutation(len(packets))].reshape(-1)


def to_whisper(audio: np.ndarray) -> np.ndarray:
    """What the phone heard, from its first to its last loud sample (0.2 s around them), at
    Whisper's 16 kHz."""
    loud = np.flatnonzero(np.abs(audio.astype(np.int32)) > LOUD)
    assert loud.size, "the phone heard no sound"
    pad = PHONE_RATE // 5
    return resample(audio[max(0, int(loud[0]) - pad):int(loud[-1]) + pad], PHONE_RATE)
