"""Pipeline settings: one pydantic model, filled from a profile's `pipeline` section (a dict)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from pipeline.model_version import FIRST_VERSION, ModelVersion

STAGE_ORDER = ("thinker", "talker", "voicebox")
# The stage that reads the tensors a stage sends with `ctx.send_tensor`: the Thinker's
# embeddings go (as refs, passed on by the API process) to the Talker. The other stages' tensor
# outputs (PCM) are read by the API process itself, on the CPU: they always use the pool.
TENSOR_CONSUMERS = {"thinker": "talker"}

# A stage worker's environment names the pipeline's private directory here (removed when the
# pipeline stops): its engine keeps its sockets and scratch files there.
RUNTIME_DIR_ENV = "OMNIVOX_RUNTIME_DIR"


class RestartPolicy(BaseModel):
    """How the supervisor watches and restarts stage workers."""

    max_attempts: int = Field(
        3, ge=1, description="failed starts in a row, or workers lost after a good start with "
        "no request served in between, before 'failed'")
    backoff_s: float = Field(0.5, gt=0, description="first wait before a restart; doubles")
    backoff_max_s: float = Field(10.0, gt=0)
    start_timeout_s: float = Field(300.0, gt=0, description="a worker must be ready by then")
    heartbeat_s: float = Field(0.5, gt=0, description="how often a worker says it is alive")
    heartbeat_timeout_s: float = Field(
        10.0, gt=0, description="silence that counts as hung, unless the worker was waiting "
        "for a CPU all along (starved: see starved_grace_s)")
    starved_grace_s: float = Field(
        30.0, ge=0, description="how much longer a silent worker that is starved of CPU, not "
        "hung, is left running before it is replaced")
    stop_timeout_s: float = Field(10.0, gt=0, description="graceful stop before SIGKILL")


class PoolSettings(BaseModel):
    """The shared-memory block pool (sized for the largest tensor: a caller's utterance)."""

    block_count: int = Field(256, ge=4)
    block_size: int = Field(1 << 20, ge=4096)
    put_timeout_s: float = Field(2.0, gt=0, description="wait for a free block, then fail")


class CascadeSettings(BaseModel):
    """How Thinker text is cut into Talker chunks, and whether the stages overlap."""

    overlap: bool = Field(True, description="False: Thinker, then Talker, then VoiceBox")
    first_chunk_chars: int = Field(16, ge=1, description="first chunk cut at a word past this")
    min_chunk_chars: int = Field(24, ge=1, description="later chunks end at a clause past this")
    max_chunk_chars: int = Field(160, ge=8, description="cut at a word past this, clause or not")
    chunk_growth: float | None = Field(
        None, gt=0, description="also cut a later chunk at a word past this many times the "
        "text before it (a slow Thinker: no silence while it writes a long clause)")
    hurry_factor: float | None = Field(
        2.0, gt=0, description="cut the next chunk early (like a first one) once the audio "
        "not yet heard is shorter than this many times the turn's longest delay of a chunk "
        "from its cut to its first audio (None: never)")
    first_group: int = Field(
        4, ge=1, description="speech tokens in a reply's first VoiceBox group, and in a "
        "chunk's first once the caller is about to run dry; in the Talkers that hand on token "
        "groups (tiny, qwen25_omni) each next group of a chunk is twice as long")
    group: int = Field(16, ge=1, description="speech tokens in each later group, at most")
    context_tokens: int = Field(256, ge=0, description="earlier speech tokens given the Talker")
    closing_chunk: bool = Field(
        False, description="mark a reply's last Talker job, and send one even when no text is "
        "left (a Talker that carries a turn's state across chunks: qwen25_omni)")


class PipelineSettings(BaseModel):
    """Everything the pipeline is told by a profile."""

    family: str = Field("tiny", description="a family name, or a dotted module with STAGES")
    models_dir: Path = Field(Path("models"), description="the models directory the served "
                             "version belongs to (version 1 lies in it; pipeline.version_checks)")
    model_version: str = Field(FIRST_VERSION, description="the served version's number")
    model_path: Path | None = Field(
        None, description="a real checkpoint the family's build derives its parts from, read "
        "where it lies (families whose build takes a `release`)")
    stages: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-stage settings handed to the stage's start()")
    pool: PoolSettings = Field(default_factory=PoolSettings)
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    cascade: CascadeSettings = Field(default_factory=CascadeSettings)
    max_turns: int = Field(256, ge=1, description="turns in flight at once")
    request_queue: int = Field(1024, ge=8, description="outputs buffered per model request")
    event_queue: int = Field(256, ge=8, description="events buffered per turn for the agent")
    abort_timeout_s: float = Field(1.0, gt=0, description="wait for a worker's abort reply")
    connect_timeout_s: float = Field(10.0, gt=0, description="wait for a worker connection")
    stall_timeout_s: float = Field(
        30.0, gt=0, description="a model request with no output for this long fails its turn "
        "(StageStalledError) and is aborted: a stuck engine never leaves a caller waiting")
    # CPU priority of each stage's processes, below the API process (0): the call plane's
    # pacing comes first, then the stages nearest the caller's ear. The Thinker writes ahead
    # of playback, so its later tokens can wait while the VoiceBox renders the first audio
    # (with equal priorities the tiny Thinker's streaming delays the first audio to its end).
    nice: dict[str, int] = Field(
        default_factory=lambda: {"thinker": 15, "talker": 10, "voicebox": 5})
    build_models: bool = Field(True, description="build the family's models when missing")
    warm_up: str | None = Field(
        None, description="the system prompt of two short turns (one heard, one answered) the "
        "pipeline runs once its stages are ready, before it says so, so that the first caller "
        "does not pay one-time costs: that prompt's prefill, each part's first run; None: none")
    cuda_ipc: bool = Field(
        True, description="a CUDA tensor one stage sends another (the Thinker's embeddings) "
        "travels as a CUDA IPC handle: chosen per tensor, only when it is on a GPU, so on a CPU "
        "host nothing changes. False: through the pool (device to host) for a consumer "
        "without CUDA")
    log_level: str = "INFO"

    @property
    def version(self) -> ModelVersion:
        """The served version, whose root the stages read."""
        return ModelVersion(self.models_dir, self.model_version)
