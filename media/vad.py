"""Voice activity segmentation of one call's inbound audio (webrtcvad with hysteresis).

A `VadSegmenter` takes the call's 16 kHz mono int16 audio in 20 ms frames and turns it into
`SpeechStarted` / `SpeechStopped` events on the call's audio timeline (milliseconds of audio
pushed so far). `SpeechStopped` carries the utterance audio: a short pre-roll from before the
onset followed by the speech itself, without the closing silence.

With `pause_ms` set (shorter than `silence_ms`), a silence that long inside an utterance is a
`SpeechPaused` carrying the audio the close would carry if the silence went on (a preemptive
reply can start on it), and a voiced frame after it, before the close, a `SpeechResumed`.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import webrtcvad
from pydantic import Field
from pydantic.dataclasses import dataclass as validated_dataclass

from media.audio_format import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE

logger = logging.getLogger(__name__)

# webrtcvad reports its first frames and a hangover of several frames after every burst as
# speech, even when the audio is digital silence. A frame whose AC energy is below this RMS
# (about -70 dBFS, far below any real speech) is never counted as voiced, so a click followed
# by silence cannot satisfy the onset and the utterance end is not pushed out by the hangover.
MIN_VOICED_RMS = 10.0


# A pydantic dataclass rather than a BaseModel: it validates on construction and on
# dataclasses.replace() alike, and a settings model can take it as a field type.
@validated_dataclass(frozen=True)
class VadConfig:
    """Settings of a `VadSegmenter`; durations are in ms and rounded up to whole 20 ms frames.

    Invalid values raise pydantic's ValidationError, a ValueError. The upper bounds keep one
    call's buffers bounded (pre-roll ring, utterance) and refuse values no caller means.
    """

    # Defaults by keyword: type checkers read a pydantic dataclass field's default only from
    # Field(default=...), and a positional one makes every field required to them.
    aggressiveness: int = Field(
        default=2, ge=0, le=3,
        description="webrtcvad mode: 0 counts the most frames as speech, 3 the fewest")
    onset_ms: int = Field(
        default=60, ge=0, le=2_000,
        description="speech must persist this long to start an utterance (0: one frame)")
    silence_ms: int = Field(
        default=500, ge=0, le=10_000,
        description="silence that ends an utterance (0: the first unvoiced frame)")
    # A reply starts at a 200 ms pause and is sent only once the silence confirms the turn:
    # up to 300 ms sooner (docs/realtime.md, "Preemptive replies").
    pause_ms: int = Field(
        default=200, ge=0, le=10_000,
        description="silence that marks a pause inside an utterance, where a reply may start "
                    "before the turn ends (0, or not shorter than silence_ms: none)")
    preroll_ms: int = Field(
        default=300, ge=0, le=5_000, description="audio kept from before the onset")
    max_utterance_ms: int = Field(
        default=30_000, ge=FRAME_MS, le=120_000,
        description="an utterance is cut here; the caller's speech goes on as the next one")


@dataclass(frozen=True)
class SpeechStarted:
    """The caller started speaking; `audio_start_ms` is the first voiced frame of the onset."""

    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    """The caller stopped speaking (or the utterance hit its length cap)."""

    audio_start_ms: int
    audio_end_ms: int
    pcm: np.ndarray
    capped: bool


@dataclass(frozen=True)
class SpeechPaused:
    """The caller has been silent for pause_ms: the utterance so far, as `SpeechStopped` would
    carry it if the silence lasts until the close."""

    audio_start_ms: int
    audio_end_ms: int
    pcm: np.ndarray


@dataclass(frozen=True)
class SpeechResumed:
    """The caller spoke again after a `SpeechPaused`: that utterance is not over."""

    audio_ms: int


VadEvent = SpeechStarted | SpeechStopped | SpeechPaused | SpeechResumed


def _frames(ms: int) -> int:
    return math.ceil(ms / FRAME_MS)


def _onset_window(onset_frames: int) -> int:
    """Frames over which the onset's voiced frames are counted: half again the onset, so a
    single unvoiced frame inside a syllable does not restart the count."""
    if onset_frames <= 1:
        return 1
    return onset_frames + max(1, onset_frames // 2)


class VadSegmenter:
    """Speech segmenter of one call: onset/offset hysteresis over webrtcvad decisions,
    a bounded pre-roll ring and a bounded utterance buffer."""

    def __init__(self, config: VadConfig) -> None:
        self._vad = webrtcvad.Vad(config.aggressiveness)
        self._frame_count = 0
        # Frames up to this index were delivered (or cleared) and never reused as pre-roll.
        self._consumed_idx = -1
        self._ring: deque[tuple[int, np.ndarray]] = deque()
        self._window: deque[bool] = deque()
        self._utterance: list[np.ndarray] = []
        self._utt_first_idx = 0
        self._start_idx = 0
        self._last_voiced_idx = 0
        self._silence_run = 0
        self._paused = False  # a SpeechPaused went out for the silence in progress
        self._in_speech = False
        self._apply(config)

    @property
    def config(self) -> VadConfig:
        return self._config

    @property
    def position_ms(self) -> int:
        """Milliseconds of audio pushed so far: the call's audio timeline."""
        return self._frame_count * FRAME_MS

    @property
    def in_speech(self) -> bool:
        return self._in_speech

    @property
    def voiced_ms(self) -> int:
        """Length of the speech in progress, onset to its last voiced frame (0 outside speech)."""
        if not self._in_speech:
            return 0
        return (self._last_voiced_idx + 1 - self._start_idx) * FRAME_MS

    def end_now(self) -> SpeechStopped | None:
        """Close the utterance in progress now if the caller is in a pause (a `SpeechPaused`
        went out and no voiced frame since): the turn is judged over before the end-of-turn
        silence says so (semantic end of turn). None, and nothing changed, otherwise."""
        if not (self._in_speech and self._paused):
            return None
        return self._close(capped=False)

    def reconfigure(self, config: VadConfig) -> None:
        """Apply new settings from the next frame on; speech in progress carries on."""
        self._apply(config)

    def clear(self) -> None:
        """Drop any speech in progress and its pre-roll; the timeline continues."""
        self._consumed_idx = self._frame_count - 1
        self._reset_detection()

    def push(self, frame: np.ndarray) -> list[VadEvent]:
        """Feed the next 20 ms frame (320 int16 samples at 16 kHz); returns the events it caused."""
        if not isinstance(frame, np.ndarray) or frame.dtype != np.int16:
            raise ValueError("a VAD frame must be a numpy int16 array")
        if frame.ndim != 1 or frame.shape[0] != FRAME_SAMPLES:
            raise ValueError(f"a VAD frame must hold exactly {FRAME_SAMPLES} samples, "
                             f"got shape {frame.shape}")
        frame = frame.copy()  # the caller may reuse its buffer
        idx = self._frame_count
        self._frame_count += 1
        voiced = self._is_voiced(frame)
        self._ring.append((idx, frame))
        if self._in_speech:
            return self._continue_speech(idx, frame, voiced)
        return self._detect_onset(idx, voiced)

    def _apply(self, config: VadConfig) -> None:
        self._config = config
        self._vad.set_mode(config.aggressiveness)
        self._onset_frames = max(1, _frames(config.onset_ms))
        self._silence_frames = max(1, _frames(config.silence_ms))
        pause = _frames(config.pause_ms)
        self._pause_frames = pause if 0 < pause < self._silence_frames else None
        self._preroll_frames = _frames(config.preroll_ms)
        self._max_frames = max(1, _frames(config.max_utterance_ms))
        window = _onset_window(self._onset_frames)
        # deque(iterable, maxlen) keeps the newest entries when it shrinks.
        self._window = deque(self._window, maxlen=window)
        self._ring = deque(self._ring, maxlen=self._preroll_frames + window)

    def _is_voiced(self, frame: np.ndarray) -> bool:
        if frame_variance(frame) < MIN_VOICED_RMS * MIN_VOICED_RMS:
            return False
        try:
            return bool(self._vad.is_speech(frame.tobytes(), SAMPLE_RATE))
        except Exception:  # webrtcvad only raises on bad input; never let one frame end a call
            logger.exception("webrtcvad rejected a frame; treating it as unvoiced")
            return False

    def _detect_onset(self, idx: int, voiced: bool) -> list[VadEvent]:
        self._window.append(voiced)
        if sum(self._window) < self._onset_frames:
            return []
        first_voiced = self._window.index(True)
        start_idx = idx - (len(self._window) - 1) + first_voiced
        first_idx = max(start_idx - self._preroll_frames, self._consumed_idx + 1)
        self._utterance = [f for i, f in self._ring if i >= first_idx]
        self._utt_first_idx = idx - len(self._utterance) + 1
        self._start_idx = start_idx
        self._last_voiced_idx = idx
        self._silence_run = 0
        self._in_speech = True
        self._window.clear()
        logger.debug("speech started at %d ms", start_idx * FRAME_MS)
        return [SpeechStarted(audio_start_ms=start_idx * FRAME_MS)]

    def _continue_speech(self, idx: int, frame: np.ndarray, voiced: bool) -> list[VadEvent]:
        self._utterance.append(frame)
        events: list[VadEvent] = []
        if voiced:
            self._last_voiced_idx = idx
            self._silence_run = 0
            if self._paused:
                self._paused = False
                events.append(SpeechResumed(audio_ms=idx * FRAME_MS))
        else:
            self._silence_run += 1
        if self._silence_run >= self._silence_frames:
            return [self._close(capped=False)]
        if idx + 1 - self._start_idx >= self._max_frames:
            return [*events, self._close(capped=True)]
        if self._silence_run == self._pause_frames:
            self._paused = True
            start_ms, end_ms, pcm = self._so_far()
            events.append(SpeechPaused(start_ms, end_ms, pcm))
        return events

    def _so_far(self) -> tuple[int, int, np.ndarray]:
        """The utterance's start and end on the timeline and its audio, to its last voiced
        frame: what a close now would deliver."""
        end_idx = self._last_voiced_idx
        pcm = np.concatenate(self._utterance[:end_idx - self._utt_first_idx + 1])
        return self._start_idx * FRAME_MS, (end_idx + 1) * FRAME_MS, pcm

    def _close(self, capped: bool) -> SpeechStopped:
        start_ms, end_ms, pcm = self._so_far()
        event = SpeechStopped(audio_start_ms=start_ms, audio_end_ms=end_ms, pcm=pcm,
                              capped=capped)
        # After a capped close the caller may still be talking: everything up to now was
        # delivered, so the next utterance needs a fresh onset and reuses none of it as pre-roll.
        self._consumed_idx = self._frame_count - 1 if capped else self._last_voiced_idx
        self._reset_detection()
        logger.debug("speech stopped at %d ms (capped=%s, %d ms of audio)",
                     event.audio_end_ms, capped, len(pcm) * 1000 // SAMPLE_RATE)
        return event

    def _reset_detection(self) -> None:
        self._in_speech = False
        self._utterance = []
        self._window.clear()
        self._silence_run = 0
        self._paused = False


def frame_variance(frame: np.ndarray) -> float:
    """The frame's power about its mean (np.var's figure): two numpy calls where np.var makes
    a dozen, which made it a twentieth of the call plane's CPU (every 20 ms of every call)."""
    samples = frame.astype(np.float64)  # 320 int16 squares sum exactly in a double
    total = float(samples.sum())
    return (float(samples @ samples) - total * total / len(samples)) / len(samples)
