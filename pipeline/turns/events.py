"""What the agent hands the pipeline (`Turn`) and what it gets back (the turn's events)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.errors import PipelineError


@dataclass(frozen=True)
class Turn:
    """One agent turn: answer `messages` (history, system first) and/or the caller's `audio`."""

    turn_id: str
    messages: list[dict[str, str]]
    audio: np.ndarray | None = None  # mono int16 at 16 kHz: the caller's utterance
    max_tokens: int = 64
    voice: str = "default"
    call_id: str = "call"  # first part of every request id: call/turn/stage/chunk
    response_format: dict[str, Any] | None = None  # JSON schema: guided decoding, never dropped
    speak: bool = True  # False: the reply in text alone (no Talker, no VoiceBox, no audio)
    recite: str | None = None  # the reply is this text, voiced as written (speech synthesis)
    transcribe: bool = False  # only hear `audio`: a Transcript, then TurnDone (no reply)
    score_end_of_turn: bool = False  # the Transcript says how likely the turn is over
    # How a history too long for the Thinker's window is cut: "auto", "disabled" or a
    # retention ratio (pipeline/families/kit/context_window.py)
    truncation: str | float = "auto"


@dataclass(frozen=True)
class TextDelta:
    """A piece of the agent's reply text, as the Thinker writes it."""

    turn_id: str
    text: str


@dataclass(frozen=True)
class Transcript:
    """What the caller said, when the family recognises speech."""

    turn_id: str
    text: str
    # The probability that the caller's turn ends with `text`, when the turn asked for it and
    # the family can tell (pipeline.stage.ThinkerOutput.end_of_turn)
    end_of_turn: float | None = None


@dataclass(frozen=True)
class AudioChunk:
    """Rendered speech for part of the reply: `text` is reply[text_start:text_end]."""

    turn_id: str
    pcm: np.ndarray = field(repr=False)  # a private copy: the pool block is already released
    sample_rate: int
    text: str
    text_start: int
    text_end: int


@dataclass(frozen=True)
class TurnDone:
    """The turn ended normally: the full reply text and what it cost."""

    turn_id: str
    text: str
    usage: dict[str, Any]


@dataclass(frozen=True)
class TurnFailed:
    """The turn ended with an error (e.g. `StageFailedError`); no event of it follows."""

    turn_id: str
    error: PipelineError


Event = TextDelta | Transcript | AudioChunk | TurnDone | TurnFailed
