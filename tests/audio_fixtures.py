"""Test speech made on the spot: espeak-ng speaks, sox converts and pads, numpy measures.

Shared by the media unit tests and the WebRTC / browser tests, so that every test knows the
exact position of the speech inside its audio.
"""

from __future__ import annotations

import shutil
import subprocess
import wave
from pathlib import Path

import av
import numpy as np

from media.outbound import FRAME_SAMPLES, SAMPLE_RATE

ESPEAK = shutil.which("espeak-ng") or "/usr/bin/espeak-ng"
SOX = shutil.which("sox") or "/usr/bin/sox"


def speech_wav(
    text: str,
    path: Path | str,
    rate: int = 48_000,
    pad_before_s: float = 1.0,
    pad_after_s: float = 2.0,
    channels: int = 1,
) -> Path:
    """Speak `text` with espeak-ng into a 16-bit WAV at `rate`, peak-normalised to -3 dBFS,
    with `pad_before_s` / `pad_after_s` seconds of digital silence around it."""
    path = Path(path)
    raw = path.with_name(path.stem + ".espeak.wav")
    subprocess.run([ESPEAK, "-w", str(raw), text], check=True, capture_output=True)
    # -D: no dither, so the padding stays digital silence and the speech bounds are exact.
    subprocess.run(
        [SOX, "-D", str(raw), "-r", str(rate), "-c", str(channels), "-b", "16", str(path),
         "gain", "-n", "-3", "pad", str(pad_before_s), str(pad_after_s)],
        check=True, capture_output=True,
    )
    raw.unlink()
    return path


def monologue_wav(folder: Path) -> np.ndarray:
    """About seven seconds of espeak-ng speech (48 kHz) with no pause long enough to end an
    utterance: a caller who never stops talking."""
    text = " ".join(["the quick brown fox jumps over the lazy dog and keeps on running"] * 2)
    path = speech_wav(text, folder / "monologue.wav", pad_before_s=0.5, pad_after_s=1.5)
    return read_wav(path)[0]


def read_wav(path: Path | str) -> tuple[np.ndarray, int]:
    """Read a 16-bit PCM WAV: samples as int16 (shape (n,) mono, (n, channels) otherwise)."""
    with wave.open(str(path), "rb") as wav:
        if wav.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM is supported")
        channels = wav.getnchannels()
        rate = wav.getframerate()
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.int16)
    if channels > 1:
        pcm = pcm.reshape(-1, channels)
    return pcm, rate


def write_wav(path: Path | str, pcm: np.ndarray, rate: int) -> Path:
    """Write int16 samples ((n,) mono or (n, channels)) as a 16-bit PCM WAV."""
    pcm = np.asarray(pcm, dtype=np.int16)
    channels = 1 if pcm.ndim == 1 else pcm.shape[1]
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm.astype("<i2").tobytes())
    return Path(path)


def speech_bounds(pcm: np.ndarray, rate: int, threshold_dbfs: float = -50.0) -> tuple[int, int]:
    """(start_ms, end_ms) of the audible part: first and last 5 ms window whose RMS is above
    `threshold_dbfs`."""
    mono = pcm if pcm.ndim == 1 else pcm.mean(axis=1)
    win = max(1, rate // 200)
    n = len(mono) // win
    blocks = mono[: n * win].astype(np.float64).reshape(n, win)
    rms = np.sqrt(np.mean(blocks * blocks, axis=1))
    loud = np.flatnonzero(rms > 32768.0 * 10 ** (threshold_dbfs / 20))
    if loud.size == 0:
        raise ValueError("no audible part in this audio")
    return int(loud[0]) * 5, (int(loud[-1]) + 1) * 5


def tone(freq_hz: float, duration_s: float, rate: int, amplitude: float = 0.5) -> np.ndarray:
    """A sine tone as int16 at `rate`."""
    t = np.arange(round(duration_s * rate)) / rate
    return (np.sin(2 * np.pi * freq_hz * t) * amplitude * 32767).astype(np.int16)


def frames_of(pcm: np.ndarray, first: int = 0) -> list[av.AudioFrame]:
    """Mono int16 `pcm` at the outbound track's rate as its 20 ms s16 frames, the first
    numbered `first`."""
    size = FRAME_SAMPLES
    frames = []
    for n in range(len(pcm) // size):
        frame = av.AudioFrame.from_ndarray(pcm[n * size:(n + 1) * size].reshape(1, -1),
                                           format="s16", layout="mono")
        frame.sample_rate, frame.pts = SAMPLE_RATE, (first + n) * size
        frames.append(frame)
    return frames


def gliding_wave(seconds: float) -> np.ndarray:
    """A 16 kHz float64 'utterance' within [-1, 1]: a tone gliding up from 200 Hz with a
    little noise, the same at every call (a fixed seed)."""
    t = np.arange(int(16_000 * seconds)) / 16_000
    rng = np.random.default_rng(7)
    wave: np.ndarray = (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)
                        + 0.02 * rng.standard_normal(t.size))
    return wave


def gliding_utterance(seconds: float) -> np.ndarray:
    """`gliding_wave` as 16 kHz int16 samples, as a caller's audio reaches a Thinker."""
    return (gliding_wave(seconds) * 32767).astype(np.int16)
