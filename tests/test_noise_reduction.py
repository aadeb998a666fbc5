"""`session.audio.input.noise_reduction`: RNNoise on the caller's audio before the VAD and the
model hear it (media/noise_reduction.py, through media/rnnoise_internals.py).

The suppressor on its own (espeak-ng speech in seeded noise at 5 dB SNR: the noise goes, the
speech stays), what the adapter takes from pyrnnoise (an upgrade that moves it fails here), the
session's setting, and a real call on the tiny family: steady noise that starts an utterance
without suppression starts none with it, and speech in that noise is still heard and answered.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openai.types.realtime import SessionUpdateEvent

from agent.calls.call_base import CallBase
from agent.config import ConversationSettings, Settings
from agent.realtime.server_events import session_object, transcription_session_object
from agent.realtime.session_config import SessionConfig, SessionConfigError, configure
from media.audio_format import FRAME_SAMPLES, SAMPLE_RATE
from media.noise_reduction import NoiseSuppressor
from media.rnnoise_internals import FRAME_SIZE, Rnnoise, library
from media.vad import VadConfig
from tests.audio_fixtures import read_wav, speech_bounds, speech_wav
from tests.product_calls import assert_valid_events, session_of, update_session
from tests.rtc_client import RtcCaller
from tests.served import Served

QUESTION = "What is the capital of France, and how far is it from here?"
SHORT_QUESTION = "What is the capital of France?"  # one utterance: no pause to end it early
SNR_DB = 5.0


def pink_noise(n: int, seed: int, rate: int) -> np.ndarray:
    """`n` samples of seeded noise whose power falls 3 dB an octave, unit RMS (float)."""
    spectrum = np.fft.rfft(np.random.default_rng(seed).standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1 / rate)
    spectrum *= np.where(freqs > 20.0, 1 / np.sqrt(np.maximum(freqs, 20.0)), 0.0)
    noise: np.ndarray = np.fft.irfft(spectrum, n)
    return noise / float(np.sqrt(np.mean(noise ** 2)))


def white_noise(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n)


def as_int16(pcm: np.ndarray) -> np.ndarray:
    return np.clip(np.round(pcm), -32768, 32767).astype(np.int16)


def power_db(pcm: np.ndarray) -> float:
    """Mean power in dB (int16 units); -120 for digital silence."""
    return float(10 * np.log10(np.mean(pcm.astype(np.float64) ** 2) + 1e-12))


def noisy_question(folder: Path, rate: int, noise: str, seed: int, text: str = QUESTION
                   ) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The question (1.5 s of padding each side) at `rate`, clean and with seeded noise
    throughout at SNR_DB below the speech's power; and where the speech starts and ends."""
    clean, _ = read_wav(speech_wav(text, folder / f"question-{rate}.wav", rate=rate,
                                   pad_before_s=1.5, pad_after_s=1.5))
    start_ms, end_ms = speech_bounds(clean, rate)
    start, end = start_ms * rate // 1000, end_ms * rate // 1000
    shape = pink_noise(len(clean), seed, rate) if noise == "pink" else white_noise(len(clean), seed)
    level = np.sqrt(np.mean(clean[start:end].astype(np.float64) ** 2) / 10 ** (SNR_DB / 10))
    return clean, as_int16(clean + shape * level / np.sqrt(np.mean(shape ** 2))), start, end


def suppressed(pcm: np.ndarray, suppressor: NoiseSuppressor | None = None) -> np.ndarray:
    """`pcm` (16 kHz) through a suppressor in 20 ms frames, each checked for size and type."""
    suppressor = suppressor or NoiseSuppressor()
    out = []
    for begin in range(0, len(pcm) - FRAME_SAMPLES + 1, FRAME_SAMPLES):
        frame = suppressor.process(pcm[begin:begin + FRAME_SAMPLES])
        assert frame.shape == (FRAME_SAMPLES,) and frame.dtype == np.int16
        out.append(frame)
    return np.concatenate(out)


def stretches(start: int, end: int, length: int, rate: int) -> dict[str, slice]:
    """The noise alone before and after the speech (a margin off each edge), and the speech."""
    margin = rate * 3 // 10
    return {"before": slice(margin, start - margin), "after": slice(end + margin, length - margin),
            "speech": slice(start, end)}


# -- the suppressor ---------------------------------------------------------------------------


@pytest.mark.parametrize("noise,seed", [("pink", 5), ("white", 6)])
def test_noise_goes_and_speech_stays(tmp_path: Path, noise: str, seed: int) -> None:
    """Measured (pink 5 / white 6): the noise alone, 65 dB in, is gone to digital silence
    (RNNoise and its gate); the speech stretch comes out 0.6 / 0.4 dB under the clean speech's
    power (its noise went too: the noisy input is 1.1 / 1.2 dB over it)."""
    clean, noisy, start, end = noisy_question(tmp_path, SAMPLE_RATE, noise, seed)
    out = suppressed(noisy)
    for name, part in stretches(start, end, len(out), SAMPLE_RATE).items():
        kept = power_db(out[part]) - power_db(noisy[part])
        print(f"{noise} {name}: {power_db(noisy[part]):.1f} dB in, {power_db(out[part]):.1f} "
              f"dB out ({kept:+.1f} dB); clean {power_db(clean[part]):.1f} dB")
        if name == "speech":
            assert -2.0 <= power_db(out[part]) - power_db(clean[part]) <= 0.5, name
        else:
            assert kept <= -40.0, name


def test_rnnoise_alone_takes_the_noise_down_and_leaves_the_speech(tmp_path: Path) -> None:
    """RNNoise itself, at 48 kHz, no gate: the noise alone loses 30 dB and more (measured, pink
    noise: 63 dB before the speech, all of it after), the speech stretch stays within a dB of
    the clean speech's power."""
    clean, noisy, start, end = noisy_question(tmp_path, 48_000, "pink", 5)
    rnnoise = Rnnoise()
    out = np.concatenate([rnnoise.process(noisy[begin:begin + FRAME_SIZE])[0]
                          for begin in range(0, len(noisy) - FRAME_SIZE + 1, FRAME_SIZE)])
    for name, part in stretches(start, end, len(out), 48_000).items():
        kept = power_db(out[part]) - power_db(noisy[part])
        print(f"rnnoise {name}: {kept:+.1f} dB; "
              f"{power_db(out[part]) - power_db(clean[part]):+.1f} dB from clean")
        if name == "speech":
            assert -1.5 <= power_db(out[part]) - power_db(clean[part]) <= 0.5
        else:
            assert kept <= -30.0, name


def test_frames_keep_their_size_and_silence_stays_silence() -> None:
    suppressor = NoiseSuppressor()
    assert not suppressed(np.zeros(SAMPLE_RATE * 2, np.int16), suppressor).any()
    assert suppressor.delay_ms == 11.0  # once, at the first frame (PyAV 18's filters + RNNoise)
    suppressed(as_int16(white_noise(SAMPLE_RATE, 1) * 3000), suppressor)
    assert suppressor.delay_ms == 11.0  # fixed from then on
    with pytest.raises(ValueError):
        suppressor.process(np.zeros(FRAME_SAMPLES, np.float32))


def test_clipping_speech_is_clipped_never_wrapped(tmp_path: Path) -> None:
    """A caller's speech three times over full scale: RNNoise's output runs past int16, which
    the adapter clips (pyrnnoise's own process_mono_frame would wrap it round into clicks of
    the opposite sign, a jump of about 65536 between neighbouring samples)."""
    clean, _ = read_wav(speech_wav(QUESTION, tmp_path / "loud.wav", rate=48_000,
                                   pad_before_s=0.2, pad_after_s=0.2))
    loud = as_int16(clean.astype(np.float64) * 3)
    rnnoise = Rnnoise()
    out = np.concatenate([rnnoise.process(loud[begin:begin + FRAME_SIZE])[0]
                          for begin in range(0, len(loud) - FRAME_SIZE + 1, FRAME_SIZE)])
    assert np.abs(out).max() >= 32767  # it did run past full scale
    assert np.abs(np.diff(out.astype(np.int32))).max() < 32768


def test_cpu_cost_per_second_of_audio() -> None:
    """One call's suppressor on this machine (printed with -s): the docs quote it."""
    noise = as_int16(white_noise(SAMPLE_RATE * 10, 3) * 3000)
    suppressor = NoiseSuppressor()
    started = time.process_time()
    suppressed(noise, suppressor)
    cost_ms = (time.process_time() - started) * 1000 / 10
    print(f"noise reduction: {cost_ms:.1f} ms of CPU per second of audio")
    assert cost_ms < 500  # real time with room to spare, even on a loaded CI machine


# -- the adapter --------------------------------------------------------------------------


def test_what_the_adapter_takes_from_pyrnnoise_is_there() -> None:
    """Every name media/rnnoise_internals.py uses, as it uses it: a pyrnnoise upgrade that
    moves one fails here (and in library(), which raises RnnoiseInternalsError naming it)."""
    module = library()
    assert (module.FRAME_SIZE, module.SAMPLE_RATE) == (480, 48_000)
    assert callable(module.create) and callable(module.destroy)
    assert module.lib.rnnoise_get_frame_size() == FRAME_SIZE
    process = module.lib.rnnoise_process_frame
    assert len(process.argtypes) == 3  # state, out, in: float*
    rnnoise = Rnnoise()
    out, speech = rnnoise.process(np.zeros(FRAME_SIZE, np.int16))
    assert out.dtype == np.int16 and out.shape == (FRAME_SIZE,) and 0.0 <= speech <= 1.0
    rnnoise.close()
    rnnoise.close()  # idempotent
    with pytest.raises(RuntimeError):
        rnnoise.process(np.zeros(FRAME_SIZE, np.int16))


# -- the session's setting ------------------------------------------------------------------


def updated(current: SessionConfig, audio_input: dict[str, Any]) -> SessionConfig:
    update = SessionUpdateEvent.model_validate({"type": "session.update", "session": {
        "type": "realtime", "audio": {"input": audio_input}}}).session
    return configure(update, current, VadConfig())


def test_the_session_turns_it_on_changes_it_keeps_it_and_turns_it_off() -> None:
    config = SessionConfig(ConversationSettings(), VadConfig())
    assert config.conversation.noise_reduction is None
    config = updated(config, {"noise_reduction": {"type": "far_field"}})
    assert config.conversation.noise_reduction == "far_field"
    config = updated(config, {"turn_detection": {"type": "server_vad"}})  # left out: kept
    assert config.conversation.noise_reduction == "far_field"
    config = updated(config, {"noise_reduction": {"strength": 1.0}})  # no type: kept
    assert config.conversation.noise_reduction == "far_field"
    described = session_object("sess_1", "tiny", config.conversation, config.vad)
    assert described["audio"]["input"]["noise_reduction"] == {"type": "far_field"}
    described = transcription_session_object("sess_1", "tiny", config.conversation, config.vad)
    assert described["audio"]["input"]["noise_reduction"] == {"type": "far_field"}
    config = updated(config, {"noise_reduction": None})
    assert config.conversation.noise_reduction is None
    described = session_object("sess_1", "tiny", config.conversation, config.vad)
    assert described["audio"]["input"]["noise_reduction"] is None
    assert updated(config, {"noise_reduction": {}}).conversation.noise_reduction == "near_field"
    with pytest.raises(SessionConfigError) as refused:
        updated(config, {"noise_reduction": {"type": "near_field", "strength": 0.5}})
    assert refused.value.param == "session.audio.input.noise_reduction"


def test_the_call_denoises_while_its_session_asks() -> None:
    """What a client commits (server VAD off) is the denoised audio while noise_reduction is
    on, the audio as it came once it is off, and denoised afresh when it is on again."""
    call = CallBase(Settings(), lambda _call: None)
    call.server_vad = False
    noise = as_int16(white_noise(SAMPLE_RATE, 4) * 3000)
    frames = [noise[begin:begin + FRAME_SAMPLES]
              for begin in range(0, len(noise), FRAME_SAMPLES)]

    def committed(noise_reduction: str | None) -> np.ndarray:
        call.conversation = call.conversation.model_copy(
            update={"noise_reduction": noise_reduction})
        for frame in frames:
            call.on_audio_frame(frame)
        taken = call.take_input()
        assert taken is not None and len(taken) == len(noise)
        return taken

    assert not committed("near_field").any()  # steady noise alone: silence
    assert np.array_equal(committed(None), noise)
    assert not committed("far_field").any()


# -- a real call ------------------------------------------------------------------------------

NOISE_RMS = 3000  # -21 dBFS pink noise: webrtcvad (aggressiveness 2) takes all of it for speech
NOISE_S = 3


@pytest.mark.engines
async def test_noise_alone_starts_no_utterance_under_suppression_and_speech_does(
    tiny_server: Served, caller: RtcCaller, tmp_path: Path
) -> None:
    """Steady noise alone: without suppression the VAD takes it for speech from start to end;
    with near_field, it starts nothing; and the question spoken in that noise is heard (an
    utterance, a reply)."""
    session = session_of(tiny_server, caller)
    noise = as_int16(pink_noise(48_000 * NOISE_S, 11, 48_000) * NOISE_RMS)
    # Null: the noise is the caller's speech to the VAD (the utterance is not answered).
    update_session(caller, max_output_tokens=8, audio={"input": {
        "noise_reduction": None, "turn_detection": {"type": "server_vad",
                                                    "create_response": False}}})
    updated = (await caller.wait_for("session.updated"))["session"]
    assert updated["audio"]["input"]["noise_reduction"] is None
    caller.audio.replace(noise)
    await asyncio.sleep(NOISE_S + 1)  # the noise, and the silence that ends its utterance
    starts = len(caller.of_type("input_audio_buffer.speech_started"))
    assert starts >= 1
    stopped = await caller.wait_for("input_audio_buffer.speech_stopped", count=starts, timeout=5)
    started = caller.of_type("input_audio_buffer.speech_started")[starts - 1]
    assert stopped["audio_end_ms"] - started["audio_start_ms"] >= (NOISE_S - 1) * 1000

    # near_field: the same noise starts nothing.
    update_session(caller, audio={"input": {"noise_reduction": {"type": "near_field"}}})
    updated = (await caller.wait_for("session.updated", count=2))["session"]
    assert updated["audio"]["input"]["noise_reduction"] == {"type": "near_field"}
    assert session.settings.noise_reduction == "near_field"
    caller.audio.replace(noise)
    await asyncio.sleep(NOISE_S + 1)
    assert len(caller.of_type("input_audio_buffer.speech_started")) == starts

    # Speech in that noise (5 dB SNR) is still heard, and answered.
    update_session(caller, audio={"input": {"turn_detection": {"type": "server_vad",
                                                               "create_response": True}}})
    await caller.wait_for("session.updated", count=3)
    _, noisy, _, _ = noisy_question(tmp_path, 48_000, "pink", 12, SHORT_QUESTION)
    caller.audio.replace(noisy)
    await caller.wait_for("input_audio_buffer.speech_started", count=starts + 1, timeout=10)
    await caller.wait_for("input_audio_buffer.speech_stopped", count=starts + 1, timeout=15)
    done = await caller.wait_for("response.done", timeout=60)
    assert done["response"]["status"] == "completed", done
    assert_valid_events(caller)
