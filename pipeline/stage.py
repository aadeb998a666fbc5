"""The contract between the stage runtime (worker processes) and a model family's stage code.

A worker process hosts exactly one `Stage`. The runtime feeds it jobs and forwards what it yields;
the family decides what runs inside (a vLLM engine, an ONNX voice, a phonemizer).
Jobs and outputs are small msgspec structs: tensors travel as `BlockRef`s into the shared pool,
or as `CudaIpcRef`s when a stage sends a CUDA tensor to another stage on CUDA
(tensors/cuda_ipc.py).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import msgspec
import numpy as np

from pipeline.sampling_options import SamplingOptions
from pipeline.tensors.cuda_ipc import CudaIpcImports, CudaIpcRef, TensorRef, TensorSender
from pipeline.tensors.shm import BlockPool, BlockRef, StaleBlockError

if TYPE_CHECKING:
    import torch

    from pipeline.tensors.shm_lease import BlockLease

POOL_TIMEOUT_S = 5.0  # how long a stage waits for a free pool block before failing the job
# CUDA IPC exports a stage keeps for their consumers at most (then it waits, as for a block).
# An export lives until the consuming job ends, so the Thinker writing ahead of the Talker in
# many turns at once holds several per turn; each is one small clone on the GPU.
CUDA_IPC_MAX_PENDING = 4096


class ThinkerJob(msgspec.Struct, frozen=True, tag="thinker_job"):
    """One Thinker request: the caller's utterance and/or the text history."""

    request_id: str
    messages: list[dict[str, str]]  # chat history, {"role", "content"}; system first
    audio: BlockRef | None = None  # 16 kHz mono int16 utterance
    max_tokens: int = 64
    response_format: dict[str, Any] | None = None  # JSON schema -> guided decoding
    sampling: SamplingOptions | None = None  # the request's own choices (text completions)
    embeds: bool = True  # False: text only, nobody voices it (no embeddings for a Talker)
    recite: str | None = None  # the reply is this text, not the model's (speech synthesis)
    transcribe: bool = False  # hear `audio` and answer nothing: its transcript alone
    # Also say how likely the transcript is a whole turn (ThinkerOutput.end_of_turn), for
    # families that can tell; the others leave it None.
    score_end_of_turn: bool = False
    # How a history too long for the window is cut (pipeline/families/kit/context_window.py)
    truncation: str | float = "auto"


class ThinkerOutput(msgspec.Struct, frozen=True, tag="thinker_out"):
    """A streamed piece of the Thinker's reply."""

    request_id: str
    text: str = ""  # text delta
    token_ids: list[int] = []
    # (prompt_rows + len(token_ids), hidden) float32: these tokens' embeddings, in pieces
    # joined along dim 0 (`StageContext.send_rows`: as many blocks as the rows need); empty: none
    embeds: list[TensorRef] = []
    transcript: str | None = None  # what the caller said, when the family recognises speech
    # With the transcript, when the job asked: the probability that the caller's turn ends
    # with these words (the Thinker's end-of-turn token after them)
    end_of_turn: float | None = None
    finished: bool = False
    finish_reason: str | None = None
    prompt_tokens: int = 0  # the request's prompt length (usage), once known
    cached_tokens: int = 0  # of those, the ones the engine's prefix cache already held
    # Leading rows of `embeds` that are the prompt's, not these tokens' (a family whose Talker
    # reads the Thinker's prompt part sends them once, with its first tokens).
    prompt_rows: int = 0


class TalkerJob(msgspec.Struct, frozen=True, tag="talker_job"):
    """One Talker request: one chunk of Thinker text to speech tokens."""

    request_id: str
    text: str  # the chunk's text (families that phonemize use this)
    # (n, thinker_hidden) float32 for families whose Talker reads embeddings: pieces joined
    # along dim 0 (`StageContext.take_tensors`); empty: none
    text_embeds: list[TensorRef] = []
    context_tokens: list[int] = []  # speech tokens this turn already produced (audio context)
    voice: str = "default"
    first_group: int = 4  # tokens in the first group handed on (fast start)
    group: int = 16  # tokens per later group
    prompt_rows: int = 0  # leading rows of text_embeds that are the Thinker's prompt part
    last: bool = False  # the reply ends with this chunk (cascade.closing_chunk: always marked)

    def next_group(self, size: int) -> int:
        """The group after one of `size` tokens: twice as long, up to `group`. Growing from a
        small first group, each group is rendered while the one before it plays."""
        return max(1, min(self.group, 2 * size))


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
    # More of the turn's tokens follow in later jobs: a VoiceBox that renders with lookahead
    # may hold back this job's last tokens for them. The turn's closing job (no tokens,
    # more=False) voices what is held back; a VoiceBox holding nothing answers it empty.
    more: bool = False


class VoiceBoxOutput(msgspec.Struct, frozen=True, tag="voicebox_out"):
    """A rendered PCM chunk (mono float32 or int16) in the shared pool."""

    request_id: str
    pcm: BlockRef | None = None
    sample_rate: int = 0
    finished: bool = False


Job = ThinkerJob | TalkerJob | VoiceBoxJob
Output = ThinkerOutput | TalkerOutput | VoiceBoxOutput
JobT = TypeVar("JobT", bound=Job)  # the jobs one stage takes
OutputT = TypeVar("OutputT", bound=Output)  # and the outputs it yields


def job_tensors(job: Job) -> list[TensorRef]:
    """The tensor pieces a job carries for its stage to take (CUDA IPC ones are mapped for it)."""
    return getattr(job, "text_embeds", None) or []


def output_tensors(output: Output) -> list[TensorRef]:
    """The tensors an output holds (what must be given back if nobody reads it)."""
    refs = [*getattr(output, "embeds", ()), getattr(output, "pcm", None)]
    return [ref for ref in refs if ref is not None]


@dataclass
class StageContext:
    """What a worker hands its stage: the shared pool, the stage's settings from the profile,
    and its ends of the tensor transport.

    `cuda_ipc` says whether the stage that reads this stage's tensors runs on CUDA (the
    pipeline's `cuda_ipc` setting, for the Thinker whose embeddings the Talker reads): then a
    CUDA tensor sent with `send_tensor` travels as a CUDA IPC export instead of a block.
    """

    pool: BlockPool
    settings: dict[str, Any]
    models_dir: str
    stage: str = ""  # this stage's name, which its CUDA IPC exports carry for their release
    cuda_ipc: bool = False
    sender: TensorSender = field(init=False, repr=False)
    imports: CudaIpcImports = field(init=False, repr=False)

    def __post_init__(self) -> None:
        max_pending = int(self.settings.get("cuda_ipc_max_pending", CUDA_IPC_MAX_PENDING))
        self.sender = TensorSender(self.pool, self.cuda_ipc, max_pending, self.stage)
        self.imports = CudaIpcImports()

    @property
    def pool_timeout_s(self) -> float:
        """Seconds the stage waits for a free pool block (setting `pool_timeout_s`)."""
        return float(self.settings.get("pool_timeout_s", POOL_TIMEOUT_S))

    def take(self, ref: BlockRef) -> np.ndarray:
        """A copy of a block's array, and the block released: for data that must outlive the
        block (kept past the job); to read it in place, use `read_tensors`."""
        array = self.pool.view(ref).copy()
        self.pool.release(ref)
        return array

    async def acquire_tensor(self, shape: Sequence[int], dtype: str = "float32") -> BlockLease:
        """A pool block for a `dtype` tensor of `shape` that the stage computes straight into
        (`lease.array`, or `lease.tensor()`, as the `out=` of the computation's last step),
        then puts in an output with `lease.send()`: the product's zero-copy path. Waits up to
        `pool_timeout_s` for room. Use it as a context manager, so that a failed write gives
        the block back; the rules of `send_tensor` for the sent ref hold."""
        return await self.pool.lease(tuple(shape), dtype, self.pool_timeout_s)

    async def send_tensor(self, tensor: np.ndarray | torch.Tensor) -> TensorRef:
        """The ref to put in an output for a tensor another stage reads: a CUDA IPC export of
        a CUDA tensor when that stage runs on CUDA too, else a block (numpy arrays and CPU
        tensors always, at the pool's cost). Waits up to `pool_timeout_s` for room. Yield the
        output holding it at once: the runtime gives back what an output it could not send
        holds, but a ref the stage drops before yielding stays taken until the worker ends."""
        return await self.sender.send(tensor, self.pool_timeout_s)

    async def send_rows(self, tensor: np.ndarray | torch.Tensor) -> list[TensorRef]:
        """The refs to put in an output for an (n, width) tensor of rows another stage reads,
        pieces it joins along dim 0 (`take_tensors`): one CUDA IPC export where `send_tensor`
        would make one, else the rows cut over as many blocks as they need
        (`BlockPool.put_rows`), so that no number of rows outgrows the pool's blocks. Each
        block waits up to `pool_timeout_s` for room; the rules of `send_tensor` hold."""
        if self.sender.uses_cuda_ipc(tensor):
            return [await self.sender.send(tensor, self.pool_timeout_s)]
        return [*await self.pool.put_rows(tensor, self.pool_timeout_s)]

    def take_tensors(self, refs: Sequence[TensorRef]) -> np.ndarray | torch.Tensor:
        """A job's tensor pieces joined along dim 0, each given back: how a stage consumes them.

        Blocks are copied out and released to the pool at once (as `take`); the result is a
        numpy array when every piece was a block. CUDA IPC pieces (mapped as the job arrived)
        are joined on their GPU, the join being the copy, and their maps dropped: the result is
        a CUDA tensor, with any block pieces moved up to it. The producer frees the exports once
        the job has ended.
        """
        if not refs:
            raise ValueError("no tensor pieces to take")
        blocks = [ref for ref in refs if isinstance(ref, BlockRef)]
        if len(blocks) == len(refs):
            if len(blocks) == 1:
                return self.take(blocks[0])
            joined: np.ndarray = np.concatenate([self.pool.view(ref) for ref in blocks])
            for ref in blocks:
                self.pool.release(ref)
            return joined
        import torch  # here, not at the top: the API process imports this module

        parts = [self.imports.take(ref) if isinstance(ref, CudaIpcRef)
                 else torch.from_numpy(self.take(ref)) for ref in refs]
        device = next(part.device for part in parts if part.is_cuda)
        return torch.cat([part.to(device) for part in parts])

    @contextlib.contextmanager
    def read_tensors(self, refs: Sequence[TensorRef]) -> Iterator[np.ndarray | torch.Tensor]:
        """A job's tensor pieces joined along dim 0, read in place; each given back on exit.

        One block is a view of it (no copy); several are joined, the join being the one copy.
        Every block is released when the `with` body ends, after the last read: nothing made
        in the body may keep pointing into the block (build a new tensor from the view, as a
        projection does). CUDA IPC pieces are taken as in `take_tensors`.
        """
        if not refs:
            raise ValueError("no tensor pieces to take")
        blocks = [ref for ref in refs if isinstance(ref, BlockRef)]
        if len(blocks) != len(refs):
            yield self.take_tensors(refs)
            return
        views: list[np.ndarray] = []
        try:
            views.extend(self.pool.take_view(ref) for ref in blocks)  # each now this stage's
            yield views[0] if len(views) == 1 else np.concatenate(views)
        finally:
            views.clear()  # no view of ours outlives its block
            for ref in blocks:
                with contextlib.suppress(StaleBlockError):  # never viewed: its sender's
                    self.pool.release(ref)

    def receive_job(self, job: Job) -> None:
        """Map the job's CUDA IPC pieces now, as it arrives (the worker's runtime calls this)."""
        self.imports.open(job_tensors(job))

    def end_job(self, job: Job) -> None:
        """Drop the job's CUDA IPC maps its stage did not take (the job has ended)."""
        self.imports.close(job_tensors(job))

    def refuse_job(self, job: Job) -> None:
        """A job refused unopened: give back the counts of CUDA IPC pieces it will never map."""
        self.imports.refuse(job_tensors(job))


class Stage(abc.ABC, Generic[JobT, OutputT]):
    """One model stage hosted in a worker process: its jobs are JobT, its outputs OutputT."""

    name: ClassVar[str]  # "thinker" | "talker" | "voicebox"

    @abc.abstractmethod
    async def start(self, ctx: StageContext) -> None:
        """Load weights and engines; raise with a clear message if that fails."""

    @abc.abstractmethod
    def stream(self, job: JobT) -> AsyncIterator[OutputT]:
        """Run one job, yielding its outputs; the last one has finished=True."""

    @abc.abstractmethod
    async def abort(self, request_ids: list[str]) -> None:
        """Abort these requests in the engine; their streams end promptly."""

    def active_request_ids(self) -> list[str]:
        """Request ids the engine itself still holds (asked of the engine, not our own books)."""
        return []

    def failure(self) -> str | None:
        """Why the stage can serve no more although its process lives (its engine died), or
        None. The worker reports it and the supervisor replaces the worker."""
        return None

    async def stop(self) -> None:  # an optional hook: stages without engines skip it
        """Shut the engine down."""
