"""The two-phase driver of the converted Qwen2.5-Omni Talker on stock vLLM (talker_lm.py).

The reference talker's inputs, in order (Qwen2_5OmniForConditionalGeneration.generate):
the thinker prompt rows projected alone; then the text-bos row with codec pad added; then the
first reply row with codec bos added; then per step, the last code's codec embedding plus the
next side row: the remaining reply rows, the text-eos row, then the text-pad row for ever.
A reply row is the thinker's final hidden state plus its token embedding, thinker-sized.

Phase 1, while a side row other than pad remains: one vLLM request per step whose
prompt_embeds are all the rows so far (max_tokens=1; prefix caching makes each a short
prefill). Phase 2, once the side input is the pad row: the converted LM's own embedding is
exactly the talker's input, so one free-running request decodes to the end of speech.
Codec bos is suppressed and codec eos or pad ends the speech, as in the reference.

A `TalkerTurn` keeps one turn's rows and codes across the Thinker's chunks: reply rows come as
the Thinker writes them, one per token, and the steps wait (the driver returns) when they run
out before the text has ended. The newest reply row always waits for the next one: the
reference never feeds the row of the reply's last token (the stop token, or the last one of a
reply cut at its length); the text-eos row takes its place once the text ends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass

import torch

from pipeline.engines.vllm import Sampling, VllmEngine
from pipeline.families.qwen25_omni.talker_lm import TalkerExtras


@dataclass(frozen=True)
class StepSampling:
    """How every step of a turn samples (per-request seeds never: engines on a CPU die of
    them, PLATFORM.md; the engine's seed applies)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_codes: int = 4096  # speech codes per turn at most (the reference's talker default)
    reference: bool = False  # sample any id but codec bos, as the reference does (parity)


class TalkerTurn:
    """One turn's Talker inputs: the rows fed so far, the side rows pending, the codes."""

    def __init__(self, extras: TalkerExtras, embedding: torch.Tensor, voice: str) -> None:
        if voice not in extras.text_bos:
            raise ValueError(f"unknown voice {voice!r}; this release has {list(extras.text_bos)}")
        self.extras, self.embedding, self.voice = extras, embedding, voice
        self.rows = torch.empty(0, embedding.shape[1])  # (n, talker_hidden), prompt of a step
        self.prompt: torch.Tensor | None = None  # projected prompt part, until the prefill
        self.sides: deque[torch.Tensor] = deque()  # W (side - pad) of rows not yet fed
        self.codes: list[int] = []
        self.text_ended = False
        self.speech_ended = False
        self.aborted = False
        self.step_id: str | None = None  # the engine request of the step in flight

    def abort(self) -> None:
        """End the speech: no further step starts (the caller aborts the one in flight)."""
        self.aborted = self.speech_ended = True

    def add_prompt(self, rows: torch.Tensor) -> None:
        """The thinker's prompt part ((n, thinker_hidden): hidden state plus embedding)."""
        if self.prompt is not None or len(self.rows):
            raise ValueError("a turn's prompt part comes once, before its reply")
        self.prompt = self.extras.project(rows)

    def add_reply(self, rows: torch.Tensor) -> None:
        """More reply rows ((n, thinker_hidden)), in the order the Thinker wrote them."""
        if self.text_ended:
            raise ValueError("reply rows after the end of the text")
        self.sides.extend(self.extras.side(rows))

    def end_text(self) -> None:
        """The reply text is complete: the text-eos row takes the place of its last token's
        row, then pad rows follow."""
        if not self.text_ended:
            self.text_ended = True
            if self.sides:
                self.sides.pop()
            self.sides.append(self.extras.side(self.extras.text_eos.unsqueeze(0))[0])

    @property
    def free_running(self) -> bool:
        """Every further side input is the pad row (phase 2)."""
        return self.text_ended and not self.sides and bool(self.codes)

    def next_prompt(self) -> torch.Tensor | None:
        """The prompt embeddings of the next step, or None: the speech ended, or the next step
        waits for reply rows. Feeds the next side row (the prompt is kept as the turn's)."""
        if self.speech_ended:
            return None
        if not self.codes:
            return self._prefill()
        if not self._ready():
            return None
        side = self.sides.popleft() if self.sides else None  # None: the pad row adds nothing
        row = self.embedding[self.codes[-1]]
        self.rows = torch.cat([self.rows, (row if side is None else row + side).unsqueeze(0)])
        return self.rows

    def take(self, code: int) -> bool:
        """Record a sampled code; False (and the speech ended) for a code that ends it."""
        if code in self.extras.codec.stops:
            self.speech_ended = True
            return False
        self.codes.append(code)
        return True

    def _ready(self) -> int:
        """Side rows the steps may feed now: all once the text ended, else all but the newest."""
        return len(self.sides) if self.text_ended else max(0, len(self.sides) - 1)

    def _prefill(self) -> torch.Tensor | None:
        """The first step's rows: prompt part, text bos + codec pad, first reply + codec bos."""
        if self.text_ended and len(self.sides) == 1:  # a reply of one token: nothing to speak
            self.speech_ended = True
        if self.speech_ended or not self._ready():
            return None
        codec, embed = self.extras.codec, self.embedding
        bos = self.extras.side(self.extras.text_bos[self.voice].unsqueeze(0))[0]
        first = [embed[codec.pad] + bos, embed[codec.bos] + self.sides.popleft()]
        prompt = self.prompt if self.prompt is not None else self.rows
        self.rows, self.prompt = torch.cat([prompt, torch.stack(first)]), None
        return self.rows


async def speak(turn: TalkerTurn, engine: VllmEngine, request_id: str,
                sampling: StepSampling) -> AsyncGenerator[int, None]:
    """The turn's next codes as they are sampled, until the speech ends or the steps must
    wait for reply rows. Step requests are `request_id/<step>`, one at a time."""
    codec = turn.extras.codec
    allowed = codec.reference_allowed() if sampling.reference else codec.speech_allowed()
    while (prompt := turn.next_prompt()) is not None:
        room = min(sampling.max_codes - len(turn.codes),
                   engine.settings.max_model_len - len(prompt))
        if room <= 0:
            turn.speech_ended = True
            return
        free = turn.free_running  # the prompt's last side row was the last non-pad one
        step = Sampling(max_tokens=room if free else 1, temperature=sampling.temperature,
                        top_p=sampling.top_p, allowed_token_ids=allowed, detokenize=False)
        turn.step_id = f"{request_id}/{len(turn.codes)}"
        try:
            async with aclosing(engine.generate(turn.step_id, prompt, step)) as deltas:
                async for delta in deltas:
                    for code in delta.token_ids:
                        if not turn.take(code):
                            return
                        yield code
                    if delta.finished and delta.finish_reason == "abort":
                        turn.abort()
                        return
        finally:
            turn.step_id = None
        if free:  # the free-running request ran to its length or the end of speech
            turn.speech_ended = True
