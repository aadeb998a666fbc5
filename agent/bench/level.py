"""One level of `omnivox bench calls`: what its callers do (`Plan`) and what it produced."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CALLERS = ("full", "light")
TURN_DETECTIONS = ("server_vad", "semantic_vad")
EAGERNESSES = ("low", "medium", "high", "auto")


@dataclass(frozen=True)
class Plan:
    """What every caller of one level does (picklable: it travels to the worker processes)."""

    url: str
    concurrency: int
    speech: tuple[str, ...]  # WAV files: 16 kHz mono int16, trimmed to the audible part
    turns: int | None = 5  # per call; or None with duration_s
    duration_s: float | None = None  # keep starting turns until this long after the start
    pause_s: float = 1.0  # after a reply has played, before the next utterance
    barge_in_every: int = 3  # every n-th reply is talked over by the next utterance; 0: never
    barge_in_after_s: float = 0.6  # reply heard before the caller talks over it
    reply_tokens: int | None = None  # session.update max_output_tokens; None: the server's
    codec: str | None = None  # offer only this codec (opus, PCMU, PCMA); None: all
    api_key: str | None = None
    turn_timeout_s: float = 60.0
    connect_timeout_s: float = 60.0
    seed: int = 0
    callers: str = "full"  # full: aiortc's encoder and decoder; light: agent/bench/light_caller.py
    # session.update turn_detection.type (and semantic_vad's eagerness); None: the server's
    turn_detection: str | None = None
    eagerness: str | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if (self.turns is None) == (self.duration_s is None):
            raise ValueError("give either turns or duration_s")
        if self.turns is not None and self.turns < 1:
            raise ValueError("turns must be at least 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("duration_s must be positive")
        if self.barge_in_every < 0 or self.barge_in_every == 1:
            raise ValueError("barge_in_every must be 0 (never) or at least 2")
        if self.callers not in CALLERS:
            raise ValueError(f"callers must be one of {', '.join(CALLERS)}, not {self.callers!r}")
        if self.callers == "light" and self.codec not in (None, "opus"):
            raise ValueError("light callers speak Opus only")
        if self.turn_detection not in (None, *TURN_DETECTIONS):
            raise ValueError(f"turn_detection must be one of {', '.join(TURN_DETECTIONS)}, "
                             f"not {self.turn_detection!r}")
        if self.eagerness is not None and (self.turn_detection != "semantic_vad"
                                           or self.eagerness not in EAGERNESSES):
            raise ValueError(f"eagerness ({', '.join(EAGERNESSES)}) goes with semantic_vad")
        if not self.speech:
            raise ValueError("no utterances to speak")


@dataclass
class LevelRun:
    """Everything one level produced, before it is summarised."""

    plan: Plan
    calls: list[dict[str, Any]]
    turns: list[dict[str, Any]]
    workers: list[dict[str, Any]]
    began: float  # the workers were started (monotonic)
    started_at: float  # every call connected: the go
    ended_at: float
    server: dict[str, Any] | None = None
