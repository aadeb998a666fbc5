"""One turn in flight: Thinker -> chunker -> Talker -> VoiceBox, as tasks joined by channels.

With overlap on, the three stage loops run at once: the Talker voices chunk k while the Thinker
writes chunk k+1, and the VoiceBox renders group j while the Talker generates group j+1. With
overlap off they run one after the other (for benchmarks). Every model request has its own id
`call/turn/stage/chunk` and is tracked until it ends, so `cancel()` can abort exactly those.
A block received from a worker is read once, into the turn's own array (the copy its data
needs: see `_take`), and released at once; a block this turn writes for a job is the job's
worker's once it reads it, and released by this turn when the job ends only if it never was.
CUDA IPC exports received from the Thinker cannot be read here: the turn keeps them and passes
them on in the Talker job of their chunk; when that job ends in any way, it tells the Thinker's
worker to free them (`ReleaseTensors`), and when the turn ends it does the same for those it
never passed on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from pipeline.errors import PipelineError, StageFailedError
from pipeline.runtime.client import StageClient, release_quietly
from pipeline.settings import STAGE_ORDER, PipelineSettings
from pipeline.stage import (
    Job,
    Output,
    TalkerJob,
    TalkerOutput,
    ThinkerJob,
    ThinkerOutput,
    VoiceBoxJob,
    VoiceBoxOutput,
)
from pipeline.tensors.cuda_ipc import CudaIpcRef, TensorRef
from pipeline.tensors.shm import BlockPool, BlockRef, StaleBlockError
from pipeline.turns.audio_ahead import AudioAhead
from pipeline.turns.cascade import Chunk, ClauseChunker, Piece
from pipeline.turns.events import (
    AudioChunk,
    Event,
    TextDelta,
    Transcript,
    Turn,
    TurnDone,
    TurnFailed,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
_CHANNEL_SIZE = 64  # chunks or groups buffered between two stage loops of a turn


class Channel(Generic[T]):
    """A FIFO between two stage loops of one turn; closing it ends the reader's iteration.

    maxsize 0 means unbounded: only the sequential mode uses it, where the content is bounded
    by the turn's max_tokens anyway.
    """

    def __init__(self, maxsize: int) -> None:
        self._items: deque[T] = deque()
        self._maxsize = maxsize
        self._closed = False
        self._readable, self._writable = asyncio.Event(), asyncio.Event()

    async def put(self, item: T) -> None:
        while self._maxsize and len(self._items) >= self._maxsize:
            self._writable.clear()
            await self._writable.wait()
        self._items.append(item)
        self._readable.set()

    def close(self) -> None:
        self._closed = True
        self._readable.set()

    def __aiter__(self) -> Channel[T]:
        return self

    async def __anext__(self) -> T:
        while not self._items:
            if self._closed:
                raise StopAsyncIteration
            self._readable.clear()
            await self._readable.wait()
        self._writable.set()
        return self._items.popleft()


@dataclass(frozen=True)
class Group:
    """Speech tokens of one Talker output, with the chunk of reply text they voice."""

    chunk: Chunk
    index: int
    tokens: list[int]


class TurnRun:
    """The cascade of one turn, its events for the agent, and its requests in flight."""

    def __init__(self, turn: Turn, clients: dict[str, StageClient], pool: BlockPool,
                 settings: PipelineSettings, overlap: bool = True) -> None:
        self.turn, self.clients, self.pool, self.settings = turn, clients, pool, settings
        self.overlap = overlap
        self.events: asyncio.Queue[Event | None] = asyncio.Queue(settings.event_queue)
        self.in_flight: dict[str, set[str]] = {stage: set() for stage in clients}
        self.cancelled = False
        self.task: asyncio.Task[None] | None = None
        # CUDA IPC exports received and not yet passed on in a job, by (stage, transfer)
        self._exports: dict[tuple[str, int], CudaIpcRef] = {}
        self._reply: list[str] = []
        # Counts, and seconds since the turn began: when the caller's words were recognised
        # (audio turns), the first reply text, the first speech tokens and the first PCM
        # arrived; voicebox_s is the time the VoiceBox requests took (its real-time factor is
        # voicebox_s / audio_s). longest_wait_s: per stage, the longest time between two of
        # its outputs (a stall shows in its own stage and in every stage after it).
        self._usage: dict[str, Any] = {"prompt_tokens": 0, "cached_tokens": 0,
                                       "thinker_tokens": 0, "speech_tokens": 0, "chunks": 0,
                                       "audio_s": 0.0, "voicebox_s": 0.0, "transcript_s": None,
                                       "first_text_s": None, "first_speech_tokens_s": None,
                                       "first_audio_s": None,
                                       "longest_wait_s": dict.fromkeys(STAGE_ORDER, 0.0)}
        self._last_output: dict[str, float] = {}
        self._t0 = time.monotonic()
        self._ahead = AudioAhead(settings.cascade.hurry_factor)

    def start(self) -> None:
        self.task = asyncio.create_task(self._drive(), name=f"turn {self.turn.turn_id}")

    async def cancel(self) -> None:
        """Stop the turn: no event of it is delivered from now on; its requests are aborted."""
        self.cancelled = True
        if self.events.empty():
            self.events.put_nowait(None)  # wake the reader, which sees `cancelled`
        if self.task is not None:
            self.task.cancel()  # before the aborts: no stage loop may move on to a next request
        aborts = [self.clients[stage].abort(list(ids)) for stage, ids in self.in_flight.items()]
        results = await asyncio.gather(*aborts, return_exceptions=True)
        for error in results:
            if isinstance(error, BaseException):
                logger.warning("turn %s: abort incomplete: %s", self.turn.turn_id, error)
        if self.task is not None:
            await asyncio.wait([self.task], timeout=self.settings.abort_timeout_s)

    def request_id(self, stage: str, chunk: int | str) -> str:
        return f"{self.turn.call_id}/{self.turn.turn_id}/{stage}/{chunk}"

    async def _drive(self) -> None:
        try:
            await self._cascade()
        finally:  # every stage loop has ended: what was never passed on goes back now
            held, self._exports = list(self._exports.values()), {}
            self._give_back(held, delivered=False)

    async def _cascade(self) -> None:
        overlap = self.overlap
        chunks: Channel[Chunk] = Channel(_CHANNEL_SIZE if overlap else 0)
        groups: Channel[Group] = Channel(_CHANNEL_SIZE if overlap else 0)
        try:
            if not self.turn.speak:
                await self._think(None)
            elif overlap:
                async with asyncio.TaskGroup() as tasks:
                    tasks.create_task(self._think(chunks))
                    tasks.create_task(self._talk(chunks, groups))
                    tasks.create_task(self._voice(groups))
            else:
                await self._think(chunks)
                await self._talk(chunks, groups)
                await self._voice(groups)
        except (Exception, BaseExceptionGroup) as exc:
            error = _first_pipeline_error(exc)
            if error is None:
                logger.exception("turn %s failed", self.turn.turn_id)
                error = PipelineError(f"{type(exc).__name__}: {exc}")
            await self._emit(TurnFailed(self.turn.turn_id, error))
            return
        self._usage["elapsed_s"] = time.monotonic() - self._t0
        self._usage["lowest_ahead_s"] = self._ahead.lowest_ahead_s
        await self._emit(TurnDone(self.turn.turn_id, "".join(self._reply), self._usage))

    async def _think(self, chunks: Channel[Chunk] | None) -> None:
        """Stream the Thinker's reply to the agent and cut it into chunks for the Talker (when
        the turn is spoken: `chunks`)."""
        turn, cascade = self.turn, self.settings.cascade
        chunker = ClauseChunker(cascade.first_chunk_chars, cascade.min_chunk_chars,
                                cascade.max_chunk_chars, cascade.chunk_growth)
        audio = None
        try:
            if turn.audio is not None:
                audio = await self.pool.put(turn.audio, self.settings.pool.put_timeout_s)
            job = ThinkerJob(self.request_id("thinker", 0), turn.messages, audio, turn.max_tokens,
                             turn.response_format, embeds=chunks is not None,
                             recite=turn.recite, transcribe=turn.transcribe,
                             score_end_of_turn=turn.score_end_of_turn,
                             truncation=turn.truncation)
            async with self._stream("thinker", job) as outputs:
                async for out in outputs:
                    assert isinstance(out, ThinkerOutput)  # a stage answers its own jobs
                    embeds = self._receive("thinker", out.embeds)  # first: nothing may leak it
                    if out.transcript is not None:
                        self._mark("transcript_s")
                        await self._emit(Transcript(turn.turn_id, out.transcript,
                                                    out.end_of_turn))
                    self._usage["thinker_tokens"] += len(out.token_ids)
                    if out.prompt_tokens:
                        self._usage["prompt_tokens"] = out.prompt_tokens
                        self._usage["cached_tokens"] = out.cached_tokens
                    if not out.text and not out.token_ids:
                        continue
                    self._output("thinker")
                    if out.text:
                        self._reply.append(out.text)
                        self._mark("first_text_s")
                        await self._emit(TextDelta(turn.turn_id, out.text))
                    if chunks is None:
                        continue
                    piece = Piece(out.text, tuple(out.token_ids), embeds, out.prompt_rows)
                    if chunk := chunker.feed(piece, self._ahead.running_low()):
                        await self._pass_on(chunk, chunks)
            if chunks is not None and (chunk := chunker.flush(cascade.closing_chunk)):
                await self._pass_on(chunk, chunks)
        finally:
            self.pool.release_unless_taken(audio)  # the Thinker releases it once it read it
            if chunks is not None:
                chunks.close()

    async def _pass_on(self, chunk: Chunk, chunks: Channel[Chunk]) -> None:
        """Hand a chunk to the Talker loop, timing its cut (the delay to its first audio)."""
        self._ahead.cut(chunk.index)
        await chunks.put(chunk)

    async def _talk(self, chunks: Channel[Chunk], groups: Channel[Group]) -> None:
        """Voice each chunk in order; the speech tokens so far are the next chunk's context."""
        cascade = self.settings.cascade
        spoken: list[int] = []
        try:
            async for chunk in chunks:
                self._usage["chunks"] += 1
                exports = self._hand_over(chunk)
                pieces: list[TensorRef] = []
                sent: list[bool] = []  # set once the job has left for the Talker's worker
                try:
                    for part in chunk.parts:  # arrays go into blocks; exports as they are
                        if isinstance(part, np.ndarray):
                            pieces += await self.pool.put_rows(
                                part.astype(np.float32, copy=False),
                                self.settings.pool.put_timeout_s)
                        else:
                            pieces.append(part)
                    context = spoken[-cascade.context_tokens:] if cascade.context_tokens else []
                    job = TalkerJob(self.request_id("talker", chunk.index), chunk.text, pieces,
                                    context, self.turn.voice,
                                    self._first_group(chunk), cascade.group,
                                    chunk.prompt_rows, chunk.last)
                    on_sent = functools.partial(sent.append, True)
                    async with self._stream("talker", job, on_sent) as outputs:
                        index = 0
                        async for out in outputs:
                            assert isinstance(out, TalkerOutput)
                            if out.tokens:
                                self._output("talker")
                                self._mark("first_speech_tokens_s")
                                spoken.extend(out.tokens)
                                await groups.put(Group(chunk, index, list(out.tokens)))
                                index += 1
                finally:  # the job has ended, whichever way: its tensors are free to go,
                    # but a block the Talker took is its to release after its last read
                    for piece in pieces:
                        if isinstance(piece, BlockRef):
                            self.pool.release_unless_taken(piece)
                    self._give_back(exports, delivered=bool(sent))
            self._usage["speech_tokens"] = len(spoken)
        finally:
            groups.close()

    def _first_group(self, chunk: Chunk) -> int:
        """The first group of a chunk's speech tokens: small for the reply's first chunk and
        whenever the caller is about to run dry (then growing, TalkerJob.next_group)."""
        cascade = self.settings.cascade
        if chunk.index == 0 or self._ahead.running_low():
            return cascade.first_group
        return cascade.group

    async def _voice(self, groups: Channel[Group]) -> None:
        """Render each group in order, telling the VoiceBox that more of the turn follows
        (it may hold back the last tokens as lookahead for the next group); once the Talker is
        done with the turn, one closing job without tokens (`voicebox/end`) gets what it held
        back, voiced as the last chunk's audio."""
        last: Chunk | None = None
        async for group in groups:
            rid = self.request_id("voicebox", f"{group.chunk.index}.{group.index}")
            await self._voice_job(VoiceBoxJob(rid, group.tokens, self.turn.voice, more=True),
                                  group.chunk)
            last = group.chunk
        if last is not None:
            closing = VoiceBoxJob(self.request_id("voicebox", "end"), [], self.turn.voice)
            await self._voice_job(closing, last)

    async def _voice_job(self, job: VoiceBoxJob, chunk: Chunk) -> None:
        """One VoiceBox job; its audio, if any, goes to the agent as `chunk`'s."""
        waiting_since = time.monotonic()  # the VoiceBox's time, not the agent's
        async with self._stream("voicebox", job) as outputs:
            async for out in outputs:
                assert isinstance(out, VoiceBoxOutput)
                pcm = self._take("voicebox", out.pcm)
                if pcm is None or not len(pcm):
                    continue
                self._usage["voicebox_s"] += time.monotonic() - waiting_since
                self._output("voicebox")
                self._mark("first_audio_s")
                seconds = len(pcm) / max(out.sample_rate, 1)
                self._usage["audio_s"] += seconds
                self._ahead.rendered(chunk.index, seconds)
                await self._emit(AudioChunk(self.turn.turn_id, pcm, out.sample_rate,
                                            chunk.text, chunk.start, chunk.end))
                waiting_since = time.monotonic()

    @contextlib.asynccontextmanager
    async def _stream(self, stage: str, job: Job, on_sent: Callable[[], None] | None = None
                      ) -> AsyncIterator[AsyncIterator[Output]]:
        """Submit `job`, tracking its request id while it is in flight (for cancel).

        A context, so that leaving the loop early ends the request at once, not at GC.
        """
        ids = self.in_flight[stage]
        ids.add(job.request_id)
        try:
            async with contextlib.aclosing(self.clients[stage].submit(job, on_sent)) as outputs:
                yield outputs
        finally:
            ids.discard(job.request_id)

    def _receive(self, stage: str, refs: list[TensorRef]) -> tuple[np.ndarray | CudaIpcRef, ...]:
        """A worker's tensor pieces, now this turn's, in order: each block's array copied out
        (the block released at once), each CUDA IPC export kept as it is, to pass on and give
        back later. Should a block be lost, the pieces after it are released all the same."""
        for ref in refs:
            if isinstance(ref, CudaIpcRef):
                self._exports[ref.stage, ref.transfer] = ref
        parts: list[np.ndarray | CudaIpcRef] = []
        try:
            for ref in refs:
                if isinstance(ref, CudaIpcRef):
                    parts.append(ref)
                elif (array := self._take(stage, ref)) is not None:
                    parts.append(array)
        except BaseException:
            for ref in refs:
                if isinstance(ref, BlockRef):
                    release_quietly(self.pool, ref)
            raise
        return tuple(parts)

    def _hand_over(self, chunk: Chunk) -> list[CudaIpcRef]:
        """The chunk's exports, which its Talker job now answers for (not the turn's end)."""
        exports = [part for part in chunk.parts if isinstance(part, CudaIpcRef)]
        for ref in exports:
            self._exports.pop((ref.stage, ref.transfer), None)
        return exports

    def _give_back(self, exports: list[CudaIpcRef], delivered: bool) -> None:
        """Tell each export's producing worker that it is done with (see ReleaseTensors)."""
        by_stage: dict[str, list[int]] = {}
        for ref in exports:
            by_stage.setdefault(ref.stage, []).append(ref.transfer)
        for stage, transfers in by_stage.items():
            client = self.clients.get(stage)
            if client is None:
                logger.warning("turn %s: CUDA IPC exports of an unknown stage %r dropped",
                               self.turn.turn_id, stage)
                continue
            client.release_tensors(transfers, delivered)

    def _take(self, stage: str, ref: BlockRef | None) -> np.ndarray | None:
        """A worker's block read once, into an array of this turn, and released at once.

        That copy is the one the data needs, its only one in this process: VoiceBox PCM goes
        on in an AudioChunk to the call's outbound queue, which holds it while it plays
        (seconds: its int16 conversion and resampling read this array), and Thinker embedding
        rows wait in the chunker for their chunk's cut. Holding the blocks instead would tie
        the pool to the caller's playback and give a Thinker writing ahead a block per delta.
        """
        if ref is None:
            return None
        try:
            data = self.pool.view(ref).copy()
        except StaleBlockError as exc:  # reclaimed: its worker died
            raise StageFailedError(stage, f"output block lost ({exc})") from None
        self.pool.release(ref)
        return data

    def _mark(self, key: str) -> None:
        if self._usage[key] is None:
            self._usage[key] = time.monotonic() - self._t0

    def _output(self, stage: str) -> None:
        """An output of `stage` came: the wait since its previous one, if the longest yet."""
        now, last = time.monotonic(), self._last_output.get(stage)
        if last is not None:
            waits = self._usage["longest_wait_s"]
            waits[stage] = max(waits[stage], now - last)
        self._last_output[stage] = now

    async def _emit(self, event: Event) -> None:
        if not self.cancelled:
            await self.events.put(event)


def _first_pipeline_error(exc: BaseException) -> PipelineError | None:
    """The first PipelineError in `exc` (an exception group from the stage loops, or not)."""
    if isinstance(exc, PipelineError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _first_pipeline_error(inner)) is not None:
                return found
    return None
