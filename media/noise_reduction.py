"""Noise suppression of a caller's audio (the Realtime session's
`audio.input.noise_reduction`): RNNoise (media/rnnoise_internals.py), run on the call's 16 kHz
20 ms frames before the VAD and the utterances hear them.

RNNoise works at 48 kHz, 480 samples (10 ms) at a time: each frame is resampled up (PyAV,
streaming: the filters' state carries from frame to frame), denoised two RNNoise frames at a
time, and resampled back down. What comes out is as long as what went in: the resamplers'
filters and the RNNoise frame still being filled are made up once with silence at the start
(`delay_ms`, 11 ms with PyAV 18), and RNNoise's output trails its input by 20 ms more.

RNNoise takes steady noise down by 40 dB and more, but what it leaves (-45 to -75 dBFS
measured) is still speech to webrtcvad, which judges a frame by its spectrum, not its level
(above -70 dBFS: media/vad.py): the VAD would start utterances on it as on the noise itself.
So RNNoise's own speech probability gates its output, as RNNoise-based suppressors do: under
SPEECH_PROBABILITY the output is silenced; OPEN_FRAMES frames over it in a row open the gate;
once it has been open SURE_MS it holds open HOLD_MS after the speech (the ends of words),
while a shorter burst (a noise's onset, before RNNoise has learnt it, scores high for 10-30
ms) closes it at once, too short for the VAD's onset. The gain ramps over one RNNoise frame
either way. The probability is RNNoise's judgement of its newest input, 20 ms ahead of the
audio it gates, so a word's onset finds the gate opening.

RNNoise has one model and no setting for the microphone's distance: OpenAI's two types,
near_field (a headset) and far_field (a laptop's or a room's microphone), both run it, and
the gate, as they are. One suppressor per call: its state is the call's noise estimate.
"""

from __future__ import annotations

import av
import numpy as np

from media.audio_format import SAMPLE_RATE
from media.rnnoise_internals import FRAME_SIZE, Rnnoise
from media.rnnoise_internals import SAMPLE_RATE as RNNOISE_RATE

SPEECH_PROBABILITY = 0.9  # RNNoise's speech probability under which its output is silenced
OPEN_FRAMES = 2  # RNNoise frames (10 ms) over it in a row that open the gate
SURE_MS = 100  # open this long, the gate holds open after the speech (shorter bursts: not)
HOLD_MS = 200  # how long it holds open after the last frames over SPEECH_PROBABILITY
_FRAME_MS = FRAME_SIZE * 1000 // RNNOISE_RATE


class _Resampler:
    """Streaming conversion of mono int16 from one rate to another (PyAV)."""

    def __init__(self, source: int, target: int) -> None:
        self._source = source
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=target)

    def convert(self, pcm: np.ndarray) -> np.ndarray:
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self._source
        pieces = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        return np.concatenate(pieces) if pieces else np.zeros(0, np.int16)


class NoiseSuppressor:
    """One call's caller audio, denoised: 16 kHz int16 frames in, frames as long out, a fixed
    delay later. RnnoiseInternalsError when pyrnnoise is not what it should be."""

    def __init__(self) -> None:
        self._rnnoise = Rnnoise()
        self._up = _Resampler(SAMPLE_RATE, RNNOISE_RATE)
        self._down = _Resampler(RNNOISE_RATE, SAMPLE_RATE)
        self._pending = np.zeros(0, np.int16)  # 48 kHz, less than one RNNoise frame
        self._ready = np.zeros(0, np.int16)  # 16 kHz, denoised, not handed on yet
        self._delay = 0  # samples of silence put in front of the first denoised audio
        self._over = 0  # RNNoise frames in a row over SPEECH_PROBABILITY
        self._open = 0  # RNNoise frames since the gate opened (0: it is closed)
        self._hold = 0  # RNNoise frames it still holds open after the speech
        self._gain = 0.0  # the gate's, at the end of the last frame

    @property
    def delay_ms(self) -> float:
        """How far the output's frames run behind the input's (RNNoise's own 20 ms not
        counted): 0 until the first frame, then fixed."""
        return self._delay * 1000 / SAMPLE_RATE

    def process(self, frame: np.ndarray) -> np.ndarray:
        """`frame` (mono int16 at 16 kHz) denoised: as many samples, `delay_ms` later."""
        if frame.ndim != 1 or frame.dtype != np.int16:
            raise ValueError(f"mono int16 frames only, not {frame.dtype} {frame.shape}")
        pending = np.concatenate([self._pending, self._up.convert(frame)])
        whole = len(pending) // FRAME_SIZE * FRAME_SIZE
        self._pending = pending[whole:].copy()
        if whole:
            denoised = np.concatenate([self._gated(pending[begin:begin + FRAME_SIZE])
                                       for begin in range(0, whole, FRAME_SIZE)])
            self._ready = np.concatenate([self._ready, self._down.convert(denoised)])
        short = len(frame) - len(self._ready)
        if short > 0:  # the filters and the RNNoise frame are still filling (the first frames)
            self._ready = np.concatenate([np.zeros(short, np.int16), self._ready])
            self._delay += short
        out, self._ready = self._ready[:len(frame)], self._ready[len(frame):].copy()
        return out

    def _gated(self, frame: np.ndarray) -> np.ndarray:
        """One RNNoise frame (48 kHz) denoised, through the gate."""
        denoised, speech = self._rnnoise.process(frame)
        self._over = self._over + 1 if speech >= SPEECH_PROBABILITY else 0
        if self._over >= OPEN_FRAMES:
            self._open += 1
            self._hold = HOLD_MS // _FRAME_MS if self._open * _FRAME_MS >= SURE_MS else 0
        elif self._hold:
            self._hold -= 1
            self._open += 1
        else:
            self._open = 0
        gain = 1.0 if self._open else 0.0
        if gain == self._gain:
            return denoised if gain else np.zeros(FRAME_SIZE, np.int16)
        ramp = np.linspace(self._gain, gain, FRAME_SIZE + 1, dtype=np.float32)[1:]
        self._gain = gain
        return np.rint(denoised * ramp).astype(np.int16)

    def close(self) -> None:
        """Free RNNoise's state now rather than when the suppressor is collected."""
        self._rnnoise.close()
