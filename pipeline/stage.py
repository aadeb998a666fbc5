"""The contract between the stage runtime (worker processes) and a model family's stage code.

A worker process hosts exactly one `Stage`. The runtime feeds it jobs and forwards what it yields;
the family decides what runs inside (a vLLM engine, an ONNX voice, a phonemizer).
Jobs and outputs are small msgspec structs: tensors travel as `BlockRef`s into the shared pool.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec
import numpy as np

from pipeline.shm import BlockPool, BlockRef

POOL_TIMEOUT_S = 5.0  # how long a stage waits for a free pool block before failing the job


class ThinkerJob(msgspec.Struct, frozen=True, tag="thinker_job"):
    """One Thinker request: the caller's utterance and/or the text history."""

    request_id: str
    messages: list[dict[str, str]]  # chat history, {"role", "content"}; system first
    audio: BlockRef | None = None  # 16 kHz mono int16 utterance
    max_tokens: int = 64
    response_format: dict[str, Any] | None = None  # JSON schema -> guided decoding


class ThinkerOutput(msgspec.Struct, frozen=True, tag="thinker_out"):
    """A streamed piece of the Thinker's reply."""

    request_id: str
    text: str = ""  # text delta
    token_ids: list[int] = []
    embeds: BlockRef | None = None  # (len(token_ids), hidden) float32: embeddings of these tokens
    transcript: str | None = None  # what the caller said, when the family recognises speech
    finished: bool = False
    finish_reason: str | None = None


class TalkerJob(msgspec.Struct, frozen=True, tag="talker_job"):
    """One Talker request: one chunk of Thinker text to speech tokens."""

    request_id: str
    text: str  # the chunk's text (families that phonemize use this)
    # (n, thinker_hidden) float32: for families whose Talker reads embeddings
    text_embeds: BlockRef | None = None
    context_tokens: list[int] = []  # speech tokens this turn already produced (audio context)
    voice: str = "default"
    first_group: int = 4  # tokens in the first group handed on (fast start)
    group: int = 16  # tokens per later group


class TalkerOutput(msgspec.Struct, frozen=True, tag="talker_out"):
    """A group of speech tokens, ready for the VoiceBox."""

    request_id: str
    tokens: list[int] = []
    finished: bool = False
    finish_reason: str | None = None


class VoiceBoxJob(msgspec.Struct, frozen=True, tag="voicebox_job"):
    """Speech tokens to waveform."""

    request_id: str
    tokens: list[int]
    voice: str = "default"


class VoiceBoxOutput(msgspec.Struct, frozen=True, tag="voicebox_out"):
    """A rendered PCM chunk (mono float32 or int16) in the shared pool."""

    request_id: str
    pcm: BlockRef | None = None
    sample_rate: int = 0
    finished: bool = False


Job = ThinkerJob | TalkerJob | VoiceBoxJob
Output = ThinkerOutput | TalkerOutput | VoiceBoxOutput


@dataclass
class StageContext:
    """What a worker hands its stage: the shared pool and the stage's settings from the profile."""

    pool: BlockPool
    settings: dict[str, Any]
    models_dir: str

    @property
    def pool_timeout_s(self) -> float:
        """Seconds the stage waits for a free pool block (setting `pool_timeout_s`)."""
        return float(self.settings.get("pool_timeout_s", POOL_TIMEOUT_S))

    def take(self, ref: BlockRef) -> np.ndarray:
        """A copy of a block's array, and the block released: how a stage consumes a block."""
        array = self.pool.view(ref).copy()
        self.pool.release(ref)
        return array


class Stage(abc.ABC):
    """One model stage hosted in a worker process."""

    name: ClassVar[str]  # "thinker" | "talker" | "voicebox"

    @abc.abstractmethod
    async def start(self, ctx: StageContext) -> None:
        """Load weights and engines; raise with a clear message if that fails."""

    @abc.abstractmethod
    def stream(self, job: Job) -> AsyncIterator[Output]:
        """Run one job, yielding its outputs; the last one has finished=True."""

    @abc.abstractmethod
    async def abort(self, request_ids: list[str]) -> None:
        """Abort these requests in the engine; their streams end promptly."""

    def active_request_ids(self) -> list[str]:
        """Request ids the engine itself still holds (asked of the engine, not our own books)."""
        return []

    async def stop(self) -> None:  # noqa: B027 - optional hook; stages without engines skip it
        """Shut the engine down."""
