"""Qwen3-Omni's Talker frame by frame: one turn's input rows and codes, and the step loop.

docs/decisions/qwen3-omni-talker-on-vllm.md: the talker LM is a pooling model; each frame is
one request over the turn's whole history of input rows, which hands back h_k, the final-norm
state of the last row. Here the worker does the rest of transformers 5.19's talker step
(`Qwen3OmniMoeTalkerForConditionalGeneration.prepare_inputs_for_generation`): the codec head on
h_k gives codebook 0's logits (c0: repetition penalty over the turn's earlier c0s, the codec's
special ids suppressed but its end of speech, then temperature / top-k / top-p), the code
predictor gives c1..c15 (`code_predictor.py`), and the frame's input row
x_k = sum of its 16 codebook embeddings + the side row s_k joins the history.

The rows (decided by the lead; the Thinker stage makes them, float32, the talker's width,
already projected by the release's text_projection / hidden_projection):
- `add_prompt`: the user part (U rows) then the assistant header's 3 rows.
- `add_reply`: one row per reply token as the Thinker writes them, the stop token included.
The prefill is the U rows and the 9 assistant rows of `_get_talker_assistant_parts`: text rows
(header, tts_pad x4, tts_bos, first reply row) plus codec rows (zeros x3, nothink, think_bos,
think_eos, speaker, pad, bos). Then the side rows: reply rows from the second on, tts_eos once
the text ended, tts_pad for ever. The reference never feeds the row of a reply's LAST token
(the stop token, or the last of a reply cut at its length: its thinker states stop one token
short, so `assistant_hidden[:, 4:]` lacks it and tts_eos takes its place), so the newest reply
row always waits for the next and `end_text` drops it. A reply of one token (its stop token
alone) gives nothing to speak. tts_bos/eos/pad are text_projection of the thinker embedding
rows of their token ids, computed once at load from the release's tensors (`TalkerParts`).

The step loop (`speak`) takes h_k from a parameter, an async `pool(rows) -> state` (vLLM's
pooling request in serving, the torch copy of the LM in tests), and runs codebook 0 and the
code predictor of every turn waiting at that moment in one batch (`batched_frames`, through
`batched_work.BatchedWork`). `TalkerTurn.abort` (barge-in) ends the turn: no step starts after
it, and a frame in flight is discarded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from transformers import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeTalkerResizeMLP,
)

from pipeline.families.kit.batched_work import BatchedWork
from pipeline.families.kit.hf_release import release_shards
from pipeline.families.kit.release_tensors import release_tensors
from pipeline.families.kit.work_thread import WorkThread
from pipeline.families.qwen3_omni.code_predictor import (
    CPU,
    GREEDY,
    PREDICTOR_SAMPLING,
    CodePredictor,
    Pick,
    pick_codes,
    uniforms,
)

HEAD_PREFIX = "talker.codec_head."
THINKER_EMBEDDING = "thinker.model.embed_tokens.weight"
TEXT_PROJECTION_PREFIX = "talker.text_projection."
HEADER_ROWS = 3  # <|im_start|>, assistant, \n
SUPPRESSED_TAIL = 1024  # the reference suppresses the talker vocabulary's last 1024 ids
MAX_BATCH = 64  # turns a batched frame takes at most (the rest wait for the next)

# The reference generate()'s talker: top-k 50, top-p 1, temperature 0.9
TALKER_SAMPLING = Pick(greedy=False, temperature=0.9, top_k=50, top_p=1.0)
Pool = Callable[[torch.Tensor], Awaitable[torch.Tensor]]  # history rows -> h of the last row


@dataclass(frozen=True)
class FrameSampling:
    """How a turn picks its frames' codes; the defaults are the reference generate()'s."""

    talker: Pick = TALKER_SAMPLING  # codebook 0
    repetition_penalty: float = 1.05  # over the turn's earlier codebook-0 codes
    predictor: Pick = PREDICTOR_SAMPLING  # codebooks 1-15
    # the reference's 4096 talker tokens: the last c0 gets no residual codes, no frame
    max_frames: int = 4095
    seed: int | None = None  # the turn's generator (None: a fresh random seed)


GREEDY_FRAMES = FrameSampling(talker=GREEDY, repetition_penalty=1.0, predictor=GREEDY)


@dataclass(frozen=True)
class TalkerCodec:
    """The talker-vocabulary ids of the codec's specials and speakers (the release config)."""

    eos: int
    pad: int
    bos: int
    nothink: int
    think_bos: int
    think_eos: int
    speakers: dict[str, int]


def suppressed_ids(vocab: int, codebook: int, eos: int) -> list[int]:
    """Codebook-0 ids never picked: the reference's last SUPPRESSED_TAIL ids of the vocabulary
    but codec eos; never below the codebook (on the release vocab - 1024 IS the codebook
    size, 2048; a smaller vocabulary, the tiny release's, keeps its codes and suppresses
    every special but eos)."""
    return [i for i in range(max(vocab - SUPPRESSED_TAIL, codebook), vocab) if i != eos]


@dataclass(frozen=True)
class FrameJob:
    """One turn's next frame to make: its state h (hidden,) and how it picks."""

    state: torch.Tensor
    earlier: tuple[int, ...]  # distinct codebook-0 codes the turn has spoken
    sampling: FrameSampling
    generator: torch.Generator


@dataclass(frozen=True)
class FrameCodes:
    """A frame's 16 codes and the sum of their embeddings (x_k without its side row), or
    the end of speech: `codes` is [codec eos] alone and `row` None."""

    codes: list[int]
    row: torch.Tensor | None


class TalkerParts:
    """What the talker's worker needs besides its LM: codec head, code predictor, codec ids,
    and the tts_bos / tts_eos / tts_pad rows and each speaker's assistant codec rows (float32,
    CPU, computed at load)."""

    def __init__(self, predictor: CodePredictor, head: torch.Tensor, tts: torch.Tensor,
                 codec: TalkerCodec) -> None:
        self.predictor, self.head, self.codec = predictor, head, codec
        self.tts_bos, self.tts_eos, self.tts_pad = tts.float().cpu()
        vocab = head.shape[0]
        blocked = suppressed_ids(vocab, int(predictor.model.config.vocab_size), codec.eos)
        self.suppressed = torch.zeros(vocab, dtype=torch.bool, device=head.device)
        self.suppressed[blocked] = True
        self.codec_rows = {name: self._codec_rows(speaker)
                           for name, speaker in codec.speakers.items()}

    @classmethod
    def load(cls, release: Path, device: torch.device = CPU,
             dtype: torch.dtype = torch.float32) -> TalkerParts:
        """From the release directory's tensors, on `device` in `dtype` (the tts rows are
        projected in float32 whatever the dtype)."""
        release = Path(release)
        parent = Qwen3OmniMoeConfig.from_pretrained(release)
        config: Any = parent.talker_config
        codec = TalkerCodec(
            eos=int(config.codec_eos_token_id), pad=int(config.codec_pad_id),
            bos=int(config.codec_bos_id), nothink=int(config.codec_nothink_id),
            think_bos=int(config.codec_think_bos_id), think_eos=int(config.codec_think_eos_id),
            speakers={str(k).lower(): int(v) for k, v in config.speaker_id.items()})
        head = release_tensors(release, HEAD_PREFIX)["weight"]
        tts = _tts_rows(release, parent)
        return cls(CodePredictor.load(release, device, dtype), head.to(device, dtype), tts, codec)

    @torch.inference_mode()
    def _codec_rows(self, speaker: int) -> torch.Tensor:
        """(9, hidden) float32 CPU: the assistant part's codec rows for this speaker."""
        c = self.codec
        ids = torch.tensor([c.nothink, c.think_bos, c.think_eos, speaker, c.pad, c.bos],
                           device=self.predictor.device)
        rows = self.predictor.codec_embedding(ids).float().cpu()
        return torch.cat([torch.zeros(HEADER_ROWS, rows.shape[1]), rows])

    def assistant_rows(self, header: torch.Tensor, first: torch.Tensor,
                       speaker: str) -> torch.Tensor:
        """(9, hidden): the prefill's assistant rows from the header's 3 rows and the first
        reply row (the reference's `_get_talker_assistant_parts`)."""
        text = torch.cat([header, self.tts_pad.expand(4, -1), self.tts_bos[None], first[None]])
        return text + self.codec_rows[speaker]

    @torch.inference_mode()
    def frames(self, jobs: list[FrameJob]) -> list[FrameCodes]:
        """The next frame of each job, all in one batch (`BatchedWork`'s batch function)."""
        states = torch.stack([job.state for job in jobs]).to(self.head.device, self.head.dtype)
        first = self.first_codes(states, jobs)
        speaking = [row for row, code in enumerate(first.tolist()) if code != self.codec.eos]
        picked = [jobs[row] for row in speaking]
        residual = self.predictor.residual_codes(
            states[speaking], first[speaking], [job.sampling.predictor for job in picked],
            [job.generator for job in picked])
        codes = torch.cat([first[speaking, None], residual], 1)
        rows = self.predictor.frame_rows(codes)
        made = [FrameCodes([self.codec.eos], None) for _ in jobs]
        for index, row in enumerate(speaking):
            made[row] = FrameCodes(codes[index].tolist(), rows[index])
        return made

    def first_codes(self, states: torch.Tensor, jobs: list[FrameJob]) -> torch.Tensor:
        """(B,) codebook-0 codes on the CPU: codec head logits, repetition penalty over each
        job's earlier codes, suppression, then each job's talker pick (the order of
        transformers' logits processors)."""
        logits = nn.functional.linear(states, self.head).float()
        logits = penalised(logits, [job.earlier for job in jobs],
                           [job.sampling.repetition_penalty for job in jobs])
        logits = logits.masked_fill(self.suppressed, float("-inf"))
        picks = [job.sampling.talker for job in jobs]
        draws = uniforms([job.generator if not job.sampling.talker.greedy else None
                          for job in jobs], 1)
        return pick_codes(logits, picks, draws[:, 0]).cpu()


def penalised(logits: torch.Tensor, earlier: list[tuple[int, ...]],
              penalties: list[float]) -> torch.Tensor:
    """The logits with each row's earlier codes penalised (transformers' repetition penalty:
    a positive logit divided by the penalty, a negative one multiplied)."""
    if all(p == 1.0 for p in penalties):
        return logits
    seen = torch.zeros(logits.shape, dtype=torch.bool)
    for row, codes in enumerate(earlier):
        seen[row, list(codes)] = True
    seen = seen.to(logits.device)
    penalty = torch.tensor(penalties, device=logits.device, dtype=logits.dtype)[:, None]
    return torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


def _tts_rows(release: Path, parent: Any) -> torch.Tensor:
    """(3, hidden) float32: text_projection of the thinker embedding rows of tts_bos, tts_eos
    and tts_pad (`parent`: the release's Qwen3OmniMoeConfig), projected together as the
    reference's generate() projects them."""
    ids = [parent.tts_bos_token_id, parent.tts_eos_token_id, parent.tts_pad_token_id]
    projection = Qwen3OmniMoeTalkerResizeMLP(parent.talker_config)
    projection.load_state_dict(release_tensors(release, TEXT_PROJECTION_PREFIX))
    with torch.inference_mode():
        rows: torch.Tensor = projection.float()(_tensor_rows(release, THINKER_EMBEDDING,
                                                             ids).float())
    return rows


def _tensor_rows(release: Path, name: str, rows: list[int]) -> torch.Tensor:
    """These rows of the release tensor `name`, read alone (a real thinker embedding is
    152064 rows)."""
    for shard in release_shards(release):
        with safe_open(Path(release) / shard, "pt") as source:
            if name in source.keys():  # noqa: SIM118 (safe_open is no mapping)
                table = source.get_slice(name)
                return torch.stack([table[row:row + 1][0] for row in rows])
    raise ValueError(f"{release}: no tensor {name}")


@dataclass(eq=False)
class TalkerTurn:
    """One turn's Talker: its rows (prefill, then a row per frame), side rows, frames.

    A step is `next_rows` (the request's rows, the turn unchanged), the pooled state into
    `job`, the frame into `take`, which commits the step: a step that fails or is cancelled
    before `take` leaves the turn as it was."""

    parts: TalkerParts
    voice: str
    sampling: FrameSampling = field(default_factory=FrameSampling)

    def __post_init__(self) -> None:
        self.voice = self.voice.lower()
        if self.voice not in self.parts.codec_rows:
            raise ValueError(f"unknown voice {self.voice!r}; this release has "
                             f"{sorted(self.parts.codec_rows)}")
        self.generator = torch.Generator()
        if self.sampling.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(self.sampling.seed)
        self.rows = torch.empty(0, self.parts.predictor.hidden_size)  # the history so far
        self.prompt: torch.Tensor | None = None  # until the prefill
        self.replies: deque[torch.Tensor] = deque()  # reply rows not yet fed
        self.frames: list[list[int]] = []
        self.spoken: set[int] = set()  # distinct codebook-0 codes so far
        self.pending: torch.Tensor | None = None  # last frame's codec row, awaiting its side
        self.asked: tuple[torch.Tensor, str] | None = None  # the step's rows, what it feeds
        self.eos_fed = self.text_ended = self.speech_ended = self.aborted = False

    def abort(self) -> None:
        """End the speech now (barge-in): no further step starts, a frame in flight is lost."""
        self.aborted = self.speech_ended = True

    def add_prompt(self, rows: torch.Tensor) -> None:
        """The prompt part (U + 3, hidden): the user part's rows, the assistant header's 3."""
        if self.prompt is not None or len(self.rows):
            raise ValueError("a turn's prompt part comes once, before its prefill")
        if rows.shape[0] < HEADER_ROWS:
            raise ValueError(f"the prompt part ends with the assistant header's {HEADER_ROWS} "
                             f"rows; {rows.shape[0]} given")
        self.prompt = rows.float().cpu()

    def add_reply(self, rows: torch.Tensor) -> None:
        """More reply rows (n, hidden), one per token, in the order the Thinker wrote them."""
        if self.text_ended:
            raise ValueError("reply rows after the end of the text")
        self.replies.extend(rows.float().cpu())

    def end_text(self) -> None:
        """The reply is complete: its last token's row is dropped (the reference never feeds
        it), tts_eos then tts_pad follow the rest."""
        if not self.text_ended:
            self.text_ended = True
            if self.replies:
                self.replies.pop()

    def next_rows(self) -> torch.Tensor | None:
        """The rows of the next pooling request (the history and the next row), or None: the
        speech ended, or the next row waits for reply rows."""
        self.asked = None
        if self.speech_ended:
            return None
        if not len(self.rows):
            return self._prefill()
        if self.pending is None:
            raise RuntimeError("a frame step before the previous frame was taken")
        side = self.next_side()
        if side is None:
            return None
        row, feeds = side
        self.asked = torch.cat([self.rows, (self.pending + row)[None]]), feeds
        return self.asked[0]

    def job(self, state: torch.Tensor) -> FrameJob:
        """The next frame's work, from the pooled state of the last history row."""
        return FrameJob(state, tuple(self.spoken), self.sampling, self.generator)

    def take(self, made: FrameCodes) -> bool:
        """Commit the step asked and record its frame; False (and the speech ended) at the
        end of speech or after abort. The frame at `max_frames` is taken and ends the speech."""
        if self.asked is None:
            raise RuntimeError("a frame taken with no step asked")
        if self.aborted or made.row is None:
            self.speech_ended, self.asked = True, None
            return False
        self._feed(*self.asked)
        self.frames.append(made.codes)
        self.spoken.add(made.codes[0])
        self.pending = made.row
        if len(self.frames) >= self.sampling.max_frames:
            self.speech_ended = True
        return True

    def _feed(self, rows: torch.Tensor, feeds: str) -> None:
        """The asked step's rows become the history; what they fed is used up."""
        self.rows, self.asked = rows, None
        if feeds == "prefill":
            self.prompt = None
        if feeds in ("prefill", "reply"):
            self.replies.popleft()
        self.eos_fed = self.eos_fed or feeds == "eos"

    def _ready(self) -> int:
        """Reply rows the steps may feed now: all once the text ended, else all but the
        newest (it may be the reply's last, which is never fed)."""
        return len(self.replies) if self.text_ended else max(0, len(self.replies) - 1)

    def next_side(self) -> tuple[torch.Tensor, str] | None:
        """The next frame's side row and what it feeds, or None while it waits for rows."""
        if self._ready():
            return self.replies[0], "reply"
        if not self.text_ended:
            return None
        return (self.parts.tts_pad, "pad") if self.eos_fed else (self.parts.tts_eos, "eos")

    def _prefill(self) -> torch.Tensor | None:
        """The first request's rows: the user part, then the 9 assistant rows."""
        if self.text_ended and not self.replies:  # a reply of its stop token alone
            self.speech_ended = True
        if self.speech_ended or self.prompt is None or not self._ready():
            return None
        prompt = self.prompt
        assistant = self.parts.assistant_rows(prompt[-HEADER_ROWS:], self.replies[0], self.voice)
        self.asked = torch.cat([prompt[:-HEADER_ROWS], assistant]), "prefill"
        return self.asked[0]


BatchedFrames = BatchedWork[FrameJob, FrameCodes]


def batched_frames(thread: WorkThread, parts: TalkerParts,
                   max_batch: int = MAX_BATCH) -> BatchedFrames:
    """Frames of concurrent turns, batched in the worker's torch thread as they queue up."""
    return BatchedWork(thread, parts.frames, max_batch)


async def speak(turn: TalkerTurn, pool: Pool,
                frames: BatchedFrames) -> AsyncGenerator[list[int], None]:
    """The turn's next frames (16 codes each) as they are made, until the speech ends or the
    next frame waits for reply rows (call again once more rows came). A step whose pool or
    frame fails leaves the turn as it was (the error goes to the caller)."""
    while (rows := turn.next_rows()) is not None:
        state = await pool(rows)
        if turn.aborted:
            return
        made = await frames.run(turn.job(state))
        if not turn.take(made):
            return
        yield made.codes
