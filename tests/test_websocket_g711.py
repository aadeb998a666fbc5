"""G.711 on a Realtime WebSocket, as telephony gateways stream it: a session.update choosing
`audio/pcmu` or `audio/pcma` (8 kHz, one byte a sample) for both ways is reported back, the
caller's μ-law / A-law appends are heard by the server VAD, and the reply comes as deltas of
the same law, at 8 kHz, as long as the playout clock counts. The codec agrees with the stdlib's
audioop byte for byte on decoding and round-trips a tone faithfully. A WebRTC call (Opus media)
refuses G.711, at session.update and in its offer's session, and takes audio/pcm at 24 kHz,
what OpenAI's SDKs send on every transport."""

from __future__ import annotations

import base64
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from aiortc import RTCPeerConnection
from openai.resources.realtime.realtime import AsyncRealtimeConnection

from agent.bench.speech import resample
from agent.calls.websocket_audio import WIRE_RATE, InputFrames, Resampler, WireFormat
from media import g711
from media.audio_format import FRAME_SAMPLES
from tests.openai_clients import until
from tests.product_calls import spoken, update_session
from tests.rtc_client import RtcCaller
from tests.served import Served

with warnings.catch_warnings():  # deprecated (gone in 3.13), and a reference all the same
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

CHUNK_MS = 100  # a gateway's append: 800 bytes of G.711
LAWS = {"audio/pcmu": (audioop.ulaw2lin, audioop.lin2ulaw),
        "audio/pcma": (audioop.alaw2lin, audioop.lin2alaw)}


def tone(rate: int, seconds: float = 1.0, hz: float = 440.0, level: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return np.round(np.sin(2 * np.pi * hz * t) * level * 32767).astype(np.int16)


def snr_db(reference: np.ndarray, decoded: np.ndarray) -> float:
    ref = reference.astype(np.float64)
    noise = ref - decoded.astype(np.float64)
    return float(10 * np.log10(np.sum(ref ** 2) / np.sum(noise ** 2)))


# -- the codec ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LAWS))
def test_every_g711_byte_decodes_as_itu_g711_does(name: str) -> None:
    """All 256 code words against the stdlib's reference (a gateway's bytes mean the same
    here), and the code words of silence: μ-law 0xFF, A-law 0xD5 (positive) / 0x55."""
    reference, encode = LAWS[name]
    every = bytes(range(256))
    wire = WireFormat(name)
    ours = wire.decode(base64.b64encode(every).decode())
    assert ours.dtype == np.int16 and len(ours) == 256
    assert np.array_equal(ours, np.frombuffer(reference(every, 2), "<i2"))
    small = np.array([0, 8, -8], np.int16)
    assert base64.b64decode(wire.encode(small)) == encode(small.tobytes(), 2)


@pytest.mark.parametrize("name", sorted(LAWS))
def test_a_tone_round_trips_through_g711_faithfully(name: str) -> None:
    """The output path (24 kHz agent audio resampled to 8 kHz, encoded, in deltas of any size)
    and back: over 30 dB of signal to noise, one byte a sample."""
    wire = WireFormat(name)
    assert wire.rate == g711.RATE and wire.ms(8) == 1.0  # 8 bytes a millisecond
    narrow = Resampler(wire.rate).convert(tone(WIRE_RATE), WIRE_RATE)
    deltas = [wire.encode(narrow[i:i + 1_234]) for i in range(0, len(narrow), 1_234)]
    payload = b"".join(base64.b64decode(d) for d in deltas)
    assert len(payload) == len(narrow)
    decoded = wire.decode(base64.b64encode(payload).decode())
    assert snr_db(narrow, decoded) > 30, snr_db(narrow, decoded)
    quiet = tone(g711.RATE, level=0.01)  # companding: a quiet tone keeps its SNR too
    assert snr_db(quiet, wire.decode(wire.encode(quiet))) > 30


def test_g711_appends_become_the_vads_16_khz_frames() -> None:
    frames: list[np.ndarray] = []
    inputs = InputFrames(frames.append)
    wire = WireFormat("audio/pcmu")
    pcm = tone(g711.RATE)
    for begin in range(0, len(pcm), 800):  # 100 ms appends
        inputs.push(wire.decode(wire.encode(pcm[begin:begin + 800])), wire.rate)
    assert all(len(f) == FRAME_SAMPLES for f in frames)
    assert 48 <= len(frames) <= 50  # a second at 20 ms, less the resampler's delay
    heard = np.concatenate(frames)[800:-800]
    assert np.abs(heard).max() > 0.4 * 32767


# -- a WebSocket conversation in G.711 ------------------------------------------------------


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """A spoken question at 8 kHz (a phone line), a second of silence after it."""
    pcm = spoken("What is the weather like tomorrow?", Path(tmp_path_factory.mktemp("speech")),
                 pad_after_s=1.0)
    return resample(pcm, 48_000, g711.RATE)


@pytest.fixture
async def conn(tiny_server: Served) -> AsyncIterator[AsyncRealtimeConnection]:
    client = openai.AsyncOpenAI(base_url=f"{tiny_server.url}/v1", api_key="local-mode")
    async with client.realtime.connect(model="omnivox-tiny") as connection:
        yield connection


@pytest.mark.engines
@pytest.mark.parametrize("name", sorted(LAWS))
async def test_a_gateway_speaks_and_hears_g711(
    conn: AsyncRealtimeConnection, tiny_server: Served, question: np.ndarray, name: str
) -> None:
    seen: list[Any] = []
    created = await until(conn, "session.created", seen)
    pcm = {"type": "audio/pcm", "rate": 24000}
    assert created.session.audio.input.format.model_dump() == pcm
    await conn.session.update(session={"type": "realtime", "audio": {
        "input": {"format": {"type": name}}, "output": {"format": {"type": name}}}})
    updated = await until(conn, "session.updated", seen)
    for side in (updated.session.audio.input, updated.session.audio.output):
        assert side.format.type == name and getattr(side.format, "rate", None) is None
    decode, encode = LAWS[name]
    step = g711.RATE * CHUNK_MS // 1000
    for begin in range(0, len(question), step):  # encoded by the reference, not by our codec
        chunk = encode(question[begin:begin + step].astype("<i2").tobytes(), 2)
        await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
    done = await until(conn, "response.done", seen)
    assert done.response.status == "completed", done
    types = [e.type for e in seen]
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
             "response.created", "response.output_audio.delta", "response.done"]
    positions = [types.index(t) for t in order]
    assert positions == sorted(positions), list(zip(order, positions, strict=True))
    payloads = [base64.b64decode(e.delta) for e in seen
                if e.type == "response.output_audio.delta" and e.response_id == done.response.id]
    assert max(len(p) for p in payloads) <= 200 * 8  # deltas of 200 ms at most, a byte a sample
    payload = b"".join(payloads)
    call = tiny_server.app.state.calls.get(created.session.id)
    clock_ms = call.outbound.played_ms + call.outbound.queued_ms  # what the client was sent
    assert abs(len(payload) / 8 - clock_ms) <= 1, (len(payload), clock_ms)
    audio = np.frombuffer(decode(payload, 2), "<i2")  # the reference reads it as this law
    assert len(audio) > g711.RATE // 2 and np.abs(audio).max() > 300  # half a second, loud


# -- a WebRTC call: its audio is Opus media, no format applies ------------------------------------


@pytest.mark.engines
async def test_a_webrtc_call_refuses_g711_and_takes_pcm(
    tiny_server: Served, caller: RtcCaller
) -> None:
    update_session(caller, audio={"output": {"format": {"type": "audio/pcmu"}}})
    error = (await caller.wait_for("error"))["error"]
    assert error["param"] == "session.audio.output.format", error
    assert "audio/pcmu applies to WebSocket calls only" in error["message"], error
    assert not caller.of_type("session.updated")
    pcm = {"type": "audio/pcm", "rate": 24000}  # what the Agents SDK and LiveKit send
    update_session(caller, audio={"input": {"format": pcm}, "output": {"format": pcm}})
    updated = (await caller.wait_for("session.updated"))["session"]
    assert updated["audio"]["input"]["format"] == updated["audio"]["output"]["format"] == pcm


@pytest.mark.engines
async def test_an_offer_whose_session_asks_for_g711_is_a_400(tiny_server: Served) -> None:
    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("audio", direction="sendrecv")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
    finally:
        await pc.close()
    client = openai.AsyncOpenAI(base_url=f"{tiny_server.url}/v1", api_key="local-needs-none")
    session: Any = {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcma"}}}}
    with pytest.raises(openai.BadRequestError) as refused:
        await client.realtime.calls.create(sdp=sdp, session=session)
    body = refused.value.body
    assert isinstance(body, dict), body
    error = body.get("error", body)
    assert (error["code"], error["param"]) == ("invalid_session",
                                              "session.audio.input.format"), error
    assert "WebSocket calls only" in error["message"]
    assert len(tiny_server.app.state.calls) == 0
