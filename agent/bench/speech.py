"""The benchmarks' callers' speech: espeak-ng utterances as 16-bit mono WAVs, cached, trimmed.

Both `omnivox bench turn` and `omnivox bench calls` speak with espeak-ng (a Debian package
the setup installs) so that no recording ships with the project and every run says the same.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import wave
from collections.abc import Iterable
from pathlib import Path

import av
import numpy as np

from pipeline import environment

MIC_RATE = 16_000  # the callers' microphones


def resample(pcm: np.ndarray, rate: int, to: int = MIC_RATE) -> np.ndarray:
    """int16 mono PCM from `rate` to `to`, in one go (a streaming resampler would keep the
    utterance's last samples for the next one)."""
    if rate == to:
        return pcm.astype(np.int16, copy=False)
    resampler = av.AudioResampler(format="s16", layout="mono", rate=to)
    frame = av.AudioFrame.from_ndarray(pcm.astype(np.int16).reshape(1, -1), format="s16",
                                       layout="mono")
    frame.sample_rate = rate
    out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    out += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(out).astype(np.int16) if out else np.zeros(0, np.int16)


def espeak(text: str, path: Path, voice: str | None = None,
           wpm: int | None = None) -> tuple[np.ndarray, int]:
    """`text` spoken by espeak-ng into the WAV `path`: int16 mono PCM and its sample rate.
    `voice` (e.g. "en-us+f2") and `wpm` (words a minute) default to espeak-ng's own."""
    binary = shutil.which("espeak-ng")
    if binary is None:
        raise RuntimeError("espeak-ng is not installed (Debian package espeak-ng)")
    options = [*(["-v", voice] if voice else []), *(["-s", str(wpm)] if wpm else [])]
    subprocess.run([binary, *options, "-w", str(path), text], check=True, capture_output=True)
    return read_wav(path)


def default_speech_dir() -> Path:
    cache = environment.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "omnivox" / "bench-speech"


def utterance_wavs(texts: Iterable[str], directory: Path) -> tuple[str, ...]:
    """Each text spoken by espeak-ng, as a cached 16 kHz mono WAV trimmed to its audible part
    (so an utterance's first and last frames are its onset and its end)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for text in texts:
        digest = hashlib.sha256(f"espeak-ng/16k/trim1:{text}".encode()).hexdigest()[:16]
        path = directory / f"{digest}.wav"
        if not path.exists():
            with tempfile.TemporaryDirectory(prefix="bench-speech-") as scratch:
                pcm, rate = espeak(text, Path(scratch) / "raw.wav")
            pcm = resample(trim(pcm, rate), rate, MIC_RATE)
            part = path.with_suffix(".part")
            write_wav(part, pcm)
            part.replace(path)  # whole files only, even with several runs at once
        paths.append(str(path))
    return tuple(paths)


def read_wav(path: Path | str) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as wav:
        if wav.getsampwidth() != 2 or wav.getnchannels() != 1:
            raise ValueError(f"{path}: want 16-bit mono PCM")
        return (np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.int16),
                wav.getframerate())


def write_wav(path: Path, pcm: np.ndarray, rate: int = MIC_RATE) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm.astype("<i2").tobytes())


def trim(pcm: np.ndarray, rate: int, threshold_dbfs: float = -50.0) -> np.ndarray:
    """`pcm` from its first to its last 5 ms window louder than threshold_dbfs."""
    window = max(1, rate // 200)
    n = len(pcm) // window
    blocks = pcm[: n * window].astype(np.float64).reshape(n, window)
    loud = np.flatnonzero(np.sqrt((blocks * blocks).mean(axis=1))
                          > 32768.0 * 10 ** (threshold_dbfs / 20))
    if loud.size == 0:
        raise ValueError("the utterance is silent")
    return pcm[int(loud[0]) * window:(int(loud[-1]) + 1) * window]
