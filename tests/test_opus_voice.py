"""The voice's own Opus encoder (media/opus_voice.py) against aiortc's Opus decoder, which every
aiortc caller uses: a tone comes back as that tone, packets are stamped 960 apart on the RTP
clock, digital silence stays small enough for the light callers to tell from sound. The
caller's mono decoder against both encoders. What they save is measured by `omnivox bench
calls` (docs/measurements/2026-12-02-light-callers.md), not here."""

from __future__ import annotations

import numpy as np
import pytest
from aiortc import RTCRtpCodecParameters
from aiortc.codecs.g711 import PcmuDecoder
from aiortc.codecs.opus import OpusDecoder, OpusEncoder
from aiortc.jitterbuffer import JitterFrame

from agent.bench.light_caller import SILENT_MAX_BYTES
from media.opus_voice import RTP_STEP, VoiceOpusDecoder, VoiceOpusEncoder
from media.outbound import SAMPLE_RATE
from media.peer import inbound_decoder
from tests.audio_fixtures import frames_of

TONE_HZ = 440.0


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    return (np.sin(2 * np.pi * TONE_HZ * t) * 8000).astype(np.int16)


def assert_the_tone(heard: list[np.ndarray]) -> None:
    pcm = np.concatenate(heard)[48_000 // 10:].astype(np.float64)  # past the codec's start
    spectrum = np.abs(np.fft.rfft(pcm))
    assert abs(np.fft.rfftfreq(len(pcm), 1 / 48_000)[int(np.argmax(spectrum))] - TONE_HZ) < 5
    assert 0.6 < np.sqrt(np.mean(pcm**2)) / (8000 / np.sqrt(2)) < 1.4  # the tone's level


def test_a_tone_comes_back_through_aiortcs_decoder_as_that_tone() -> None:
    encoder, decoder = VoiceOpusEncoder(), OpusDecoder()
    stamps, heard = [], []
    for frame in frames_of(tone(1.0)):
        payloads, timestamp = encoder.encode(frame)
        assert len(payloads) == 1
        stamps.append(timestamp)
        for decoded in decoder.decode(JitterFrame(data=payloads[0], timestamp=timestamp)):
            heard.append(decoded.to_ndarray().reshape(-1, 2)[:, 0])  # stereo s16
    assert np.all(np.diff(stamps) == RTP_STEP) and stamps[0] == 0
    assert_the_tone(heard)


def tone_snr_db(heard: np.ndarray, sent: np.ndarray, begin: int, end: int) -> float:
    """How far `heard` (decoded, 48 kHz) is from `sent` over [begin, end), in dB."""
    delay = 120  # the restricted low-delay mode's 2.5 ms
    got = heard[begin + delay:end + delay].astype(np.float64)
    want = sent[begin:end].astype(np.float64)
    return float(10 * np.log10(np.sum(want**2) / np.sum((want - got) ** 2)))


def test_settled_silence_is_sent_again_uncoded_and_the_voice_after_it_is_as_clear() -> None:
    """Silence sent as its settled packet, not coded: the packets the caller gets for it are the
    ones coding would give, and the tone after the silence decodes as cleanly as when every
    frame is coded (the caller's decoder and the encoder still agree)."""
    pcm = np.concatenate([tone(0.5), np.zeros(SAMPLE_RATE, np.int16), tone(0.5)])
    sent: dict[bool, list[bytes]] = {}
    heard: dict[bool, np.ndarray] = {}
    for reuse in (True, False):
        encoder, decoder = VoiceOpusEncoder(reuse_silence=reuse), VoiceOpusDecoder()
        sent[reuse], decoded = [], []
        for frame in frames_of(pcm):
            payloads, timestamp = encoder.encode(frame)
            sent[reuse] += payloads
            decoded += [f.to_ndarray().reshape(-1)
                        for f in decoder.decode(JitterFrame(payloads[0], timestamp))]
        heard[reuse] = np.concatenate(decoded)
        assert (encoder.reused > 25) is reuse, encoder.reused  # of the 50 silent frames
    silence = slice(25 + 15, 75)  # past the tone's tail
    assert sent[True][silence] == sent[False][silence]
    second = (SAMPLE_RATE * 3 // 2 + 4_800, SAMPLE_RATE * 2 - 240)  # past its onset
    clear = tone_snr_db(heard[False], pcm, *second)
    assert clear > 30, clear
    assert tone_snr_db(heard[True], pcm, *second) > clear - 1


@pytest.mark.parametrize("encoder", [VoiceOpusEncoder, OpusEncoder],
                         ids=["mono voice", "aiortc's stereo"])
def test_the_callers_decoder_hears_the_tone_in_mono(encoder: type) -> None:
    """What a caller sends, mono (the voice's encoder, browsers) or stereo (aiortc's), comes out
    of the caller's decoder as mono 48 kHz frames of that tone."""
    coder, decoder = encoder(), VoiceOpusDecoder()
    heard = []
    for frame in frames_of(tone(1.0)):
        payloads, timestamp = coder.encode(frame)
        for payload in payloads:
            for decoded in decoder.decode(JitterFrame(data=payload, timestamp=timestamp)):
                assert (decoded.layout.name, decoded.sample_rate) == ("mono", SAMPLE_RATE)
                heard.append(decoded.to_ndarray().reshape(-1))
    assert_the_tone(heard)


def test_the_server_decodes_opus_with_the_mono_decoder_and_g711_with_aiortcs() -> None:
    opus = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48_000, channels=2)
    pcmu = RTCRtpCodecParameters(mimeType="audio/PCMU", clockRate=8_000)
    assert isinstance(inbound_decoder(opus), VoiceOpusDecoder)
    assert isinstance(inbound_decoder(pcmu), PcmuDecoder)


def test_digital_silence_codes_small_enough_for_the_light_callers() -> None:
    encoder = VoiceOpusEncoder()
    sizes = [len(encoder.encode(f)[0][0]) for f in frames_of(np.zeros(SAMPLE_RATE, np.int16))]
    assert max(sizes[5:]) <= SILENT_MAX_BYTES, sizes
    spoken = [len(encoder.encode(f)[0][0]) for f in frames_of(tone(0.5))]
    assert min(spoken[5:]) > SILENT_MAX_BYTES, spoken


def test_a_frame_of_another_shape_is_refused() -> None:
    frame = frames_of(tone(0.1))[0]
    frame.sample_rate = 16_000
    with pytest.raises(ValueError, match="48000 Hz mono"):
        VoiceOpusEncoder().encode(frame)

