"""Awkward caller audio through real calls (aiortc caller, real codecs, the server's VAD):
silence only, speech clipped at full scale, speech on a DC offset (Opus and G.711), and a
caller who never stops talking, whose speech is cut into utterances at the length cap.
(G.711 calls at 8 kHz, PCMU and PCMA, are covered in test_call_audio.py.)"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import av
import numpy as np
import pytest

from agent.config import Settings
from media.audio_format import SAMPLE_RATE
from tests.audio_fixtures import monologue_wav, read_wav, speech_bounds, speech_wav
from tests.media_servers import call_of, responder_of, tone_server
from tests.product_calls import wait_until
from tests.rtc_client import ArrayAudioTrack, RtcCaller
from tests.served import Served

RATE = 48_000
TOLERANCE_MS = 200
FULL_SCALE = 32767


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """About two seconds of espeak-ng speech, 48 kHz, with 1 s of silence before, 1.5 s after."""
    path = speech_wav("Could you book a table for two at eight?",
                      tmp_path_factory.mktemp("speech") / "speech.wav",
                      pad_before_s=1.0, pad_after_s=1.5)
    return read_wav(path)[0]


@pytest.fixture(scope="module")
def monologue(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return monologue_wav(tmp_path_factory.mktemp("speech"))


async def call(url: str, pcm: np.ndarray, codecs: tuple[str, ...] = ()) -> RtcCaller:
    caller = RtcCaller(url, ArrayAudioTrack(pcm), codecs=codecs)
    await caller.connect()
    await caller.wait_for("session.created", timeout=20)
    return caller



def speech_events(caller: RtcCaller) -> list[str]:
    return [e["type"] for _, e in caller.events if e["type"].startswith("input_audio_buffer.")]


async def test_silence_only_makes_no_turn(media_server: Served) -> None:
    caller = await call(media_server.url, np.zeros(0, np.int16))
    try:
        server_call = call_of(media_server, caller)
        # Four seconds of the caller's (digital) silence through the codec and the VAD.
        await wait_until(lambda: server_call.vad.position_ms >= 4_000, 30, "4 s of audio")
        assert speech_events(caller) == []
        assert responder_of(media_server, caller).utterances == []
    finally:
        await caller.hang_up()


async def test_full_scale_clipped_speech_is_segmented(
    media_server: Served, speech: np.ndarray
) -> None:
    """Speech amplified 20x into hard clipping, then the same speech as it was: both are
    utterances at their positions and the loud one reaches the handler at full scale."""
    clipped = np.clip(speech.astype(np.int32) * 20, -FULL_SCALE - 1, FULL_SCALE).astype(np.int16)
    start_ms, end_ms = speech_bounds(clipped, RATE)
    caller = await call(media_server.url, np.concatenate([clipped, speech]))
    try:
        first = await caller.wait_for("input_audio_buffer.speech_stopped", timeout=20)
        second = await caller.wait_for("input_audio_buffer.speech_stopped", timeout=20, count=2)
        started = caller.of_type("input_audio_buffer.speech_started")[0]
        assert abs(started["audio_start_ms"] - start_ms) <= TOLERANCE_MS, (started, start_ms)
        assert abs(first["audio_end_ms"] - end_ms) <= TOLERANCE_MS, (first, end_ms)
        normal_start, _ = speech_bounds(speech, RATE)
        second_start = caller.of_type("input_audio_buffer.speech_started")[1]["audio_start_ms"]
        offset = len(clipped) * 1000 // RATE
        assert abs(second_start - (offset + normal_start)) <= TOLERANCE_MS
        assert second["audio_end_ms"] > second_start
        loud = responder_of(media_server, caller).utterances[0].pcm
        assert np.abs(loud.astype(np.int32)).max() >= 0.8 * FULL_SCALE
    finally:
        await caller.hang_up()


@pytest.mark.parametrize("codecs", [(), ("PCMU",)], ids=["opus", "pcmu"])
async def test_dc_offset_alone_is_silence_and_speech_on_it_is_found(
    media_server: Served, speech: np.ndarray, codecs: tuple[str, ...]
) -> None:
    """Two seconds of a bare DC offset (a quarter of full scale), then speech riding on it:
    one utterance, where the speech is. G.711 carries the offset through; Opus mostly not."""
    dc = 8_000
    on_dc = np.clip(speech.astype(np.int32) // 2 + dc, -FULL_SCALE - 1, FULL_SCALE)
    pcm = np.concatenate([np.full(2 * RATE, dc), on_dc]).astype(np.int16)
    start_ms, end_ms = speech_bounds(speech, RATE)
    caller = await call(media_server.url, pcm, codecs)
    try:
        stopped = await caller.wait_for("input_audio_buffer.speech_stopped", timeout=20)
        started = caller.of_type("input_audio_buffer.speech_started")[0]
        assert abs(started["audio_start_ms"] - (2_000 + start_ms)) <= TOLERANCE_MS
        assert abs(stopped["audio_end_ms"] - (2_000 + end_ms)) <= TOLERANCE_MS
        server_call = call_of(media_server, caller)
        heard_until = server_call.vad.position_ms + 1_500  # the DC goes on for 1.5 s after
        await wait_until(lambda: server_call.vad.position_ms >= heard_until, 30, "the tail")
        assert len(caller.of_type("input_audio_buffer.speech_started")) == 1
        if codecs:  # G.711 kept the offset: the VAD really saw it
            utterance = responder_of(media_server, caller).utterances[0].pcm
            assert abs(float(utterance.mean())) > dc / 4
    finally:
        await caller.hang_up()


async def test_a_caller_who_never_stops_is_cut_at_the_utterance_cap(
    monologue: np.ndarray, tmp_path: Path
) -> None:
    cap_ms = 2_000
    settings = Settings(data_dir=tmp_path, vad={"max_utterance_ms": cap_ms})
    start_ms, end_ms = speech_bounds(monologue, RATE)
    assert end_ms - start_ms > 3 * cap_ms
    async with tone_server(settings) as served:
        caller = await call(served.url, monologue)
        try:
            responder = responder_of(served, caller)
            await wait_until(lambda: responder.utterances and not responder.utterances[-1].capped,
                             60, "the utterance that ends when the caller stops")
            pieces = responder.utterances
            capped = [u for u in pieces if u.capped]
            assert len(capped) >= (end_ms - start_ms) // cap_ms - 1, pieces
            for piece in capped:
                assert piece.audio_end_ms - piece.audio_start_ms <= cap_ms
                preroll_ms = settings.vad.preroll_ms
                assert len(piece.pcm) <= (cap_ms + preroll_ms) * SAMPLE_RATE // 1000
            # Nothing of the monologue is lost between the pieces, and it is all covered.
            assert abs(pieces[0].audio_start_ms - start_ms) <= TOLERANCE_MS
            assert abs(pieces[-1].audio_end_ms - end_ms) <= TOLERANCE_MS
            for before, after in itertools.pairwise(pieces):
                assert 0 <= after.audio_start_ms - before.audio_end_ms <= 400, (before, after)
            # The caller was told about each piece, as a speech_started / speech_stopped pair.
            await caller.wait_for("input_audio_buffer.speech_stopped", count=len(pieces))
            assert speech_events(caller) == [
                "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"
            ] * len(pieces)
        finally:
            await caller.hang_up()


class FallsSilentTrack(ArrayAudioTrack):
    """Sends `frames` 20 ms frames, then no more packets at all (the call stays up)."""

    def __init__(self, frames: int) -> None:
        super().__init__(np.zeros(0, np.int16))
        self.frames = frames

    async def recv(self) -> av.AudioFrame:
        if self._n >= self.frames:
            await asyncio.Event().wait()  # until the caller closes the track
        return await super().recv()


@pytest.mark.parametrize("held", [1, 4])
async def test_the_server_holds_the_configured_packets_before_decoding(held: int) -> None:
    """Caller audio reaches the VAD `held` packets late (aiortc alone holds 4, 80 ms): after
    the caller's last packet, exactly `held` of them are still undecoded, however long we
    wait, since a packet is only released once `held` later ones have arrived."""
    sent = 50
    async with tone_server(Settings(inbound_jitter_packets=held)) as served:
        caller = RtcCaller(served.url, FallsSilentTrack(sent))
        try:
            await caller.connect()
            server_call = call_of(served, caller)
            await wait_until(lambda: server_call.inbound is not None
                             and server_call.inbound.frames_in >= sent - held, 20,
                             "the caller's packets to be decoded")
            await asyncio.sleep(1.0)  # any packet still held would have been released by now
            assert caller.audio.position_ms == sent * 20
            assert server_call.inbound.frames_in == sent - held
        finally:
            await caller.close()
