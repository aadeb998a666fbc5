"""`omnivox bench answers`: how often the `local` profile's Thinker answers the question set
(answer_set.py) right, typed or through speech, per category, with the median answer latency.

The Thinker stage runs in this process with the profile's settings, as a worker runs it. Typed,
the question joins the history as text (after the call's default instructions as the system
message, as in a call); through speech, it is said by one of the ASR corpus's
espeak-ng voices (in turn) and the Thinker hears it with its own recognizer, as in a call. The
latency is from the job given to its last reply token (recognition included), one at a time.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.bench.answer_score import Answered, by_category
from agent.bench.answer_set import QUESTIONS, Question
from agent.bench.report import write_json
from agent.profiles import load_profiles
from pipeline.stage import ThinkerJob
from pipeline.tensors.shm import BlockPool

TARGET = 0.80  # share right through speech (issue 17)
SPEAKERS = ("en-us", "en-gb", "en-us+m3", "en-us+f2")  # asr_voices.VOICES' espeak voices


@dataclass(frozen=True)
class Options:
    models_dir: Path
    through_speech: bool
    limit: int | None
    max_tokens: int
    json_path: Path | None
    system: str  # the system message ("": none, the Thinker's own system prompt then)
    overrides: dict[str, Any]  # Thinker settings over the profile's (e.g. examples)


def thinker_settings(overrides: dict[str, Any]) -> dict[str, Any]:
    """The `local` profile's Thinker settings with `overrides` on top."""
    stages = load_profiles()["local"].get("stages", {})
    return {**stages.get("thinker", {}), **overrides}


def spoken(questions: Sequence[Question]) -> list[np.ndarray]:
    """Each question said (16 kHz int16) by the next of SPEAKERS, at the normal rate, after
    the silence a call's VAD keeps from before the onset (its preroll; the closing silence is
    not part of an utterance)."""
    from agent.bench.asr_voices import VOICES, speak
    from agent.bench.speech import MIC_RATE
    from media.vad import VadConfig

    voices = {v.name: v for v in VOICES}
    lead = np.zeros(VadConfig().preroll_ms * MIC_RATE // 1000, dtype=np.int16)
    return [np.concatenate([lead, speak(voices[SPEAKERS[i % len(SPEAKERS)]], q.question, 1.0)])
            for i, q in enumerate(questions)]


@asynccontextmanager
async def local_thinker(settings: dict[str, Any], models_dir: Path
                        ) -> AsyncIterator[tuple[Any, BlockPool]]:
    """The local family's Thinker stage started in this process with `settings`, and the
    shared-memory pool its jobs' audio is written to."""
    from pipeline.families.local.thinker import LocalThinker
    from pipeline.stage import StageContext

    pool = BlockPool.create(f"omnivox-bench-{os.getpid()}", block_count=4, block_size=1 << 21)
    thinker = LocalThinker()
    try:
        await thinker.start(StageContext(pool, settings, str(models_dir), stage="thinker"))
        try:
            yield thinker, pool
        finally:
            await thinker.stop()
    finally:
        pool.close()
        pool.unlink()


async def ask_all(questions: Sequence[Question], settings: dict[str, Any], models_dir: Path,
                  audio: Sequence[np.ndarray] | None, max_tokens: int,
                  system: str) -> list[Answered]:
    """Each question put to a Thinker started here (typed, or as its `audio`), in order."""
    async with local_thinker(settings, models_dir) as (thinker, pool):
        await _ask(thinker, pool, QUESTIONS[0], None, max_tokens, system, "warm-up")
        return [await _ask(thinker, pool, q, audio[i] if audio is not None else None,
                           max_tokens, system, f"q{i}") for i, q in enumerate(questions)]


async def _ask(thinker: Any, pool: BlockPool, question: Question, audio: np.ndarray | None,
               max_tokens: int, system: str, rid: str) -> Answered:
    messages = [{"role": "system", "content": system}] if system else []
    messages += question.messages()
    if audio is None:
        messages.append({"role": "user", "content": question.question})
    began = time.perf_counter()
    job = ThinkerJob(rid, messages, audio=pool.write(audio, 10.0) if audio is not None else None,
                     max_tokens=max_tokens, embeds=False)
    heard, text = question.question if audio is None else "", []
    async for out in thinker.stream(job):
        heard = out.transcript if out.transcript is not None else heard
        text.append(out.text)
    return Answered(question, heard, "".join(text).strip(), (time.perf_counter() - began) * 1e3)


def run(options: Options) -> int:
    from pipeline.families.local.build import build_local

    build_local(options.models_dir, False)
    questions = QUESTIONS[:options.limit]
    audio = spoken(questions) if options.through_speech else None
    settings = thinker_settings(options.overrides)
    answered = asyncio.run(ask_all(questions, settings, options.models_dir, audio,
                                   options.max_tokens, options.system))
    mode = "through speech" if options.through_speech else "typed"
    print_answers(answered)
    print_table(answered, mode)
    if options.json_path:
        write_json(options.json_path, report(answered, mode, options))
    return 0


def print_answers(answered: Sequence[Answered]) -> None:
    """The wrong answers, with what was heard."""
    wrong = [a for a in answered if not a.right]
    print(f"\nwrong answers, or asked again ({len(wrong)}):")
    for a in wrong:
        print(f"  [{a.question.category}] {a.question.question!r} heard {a.heard!r}: "
              f"{'(asked again)' if a.asked_again else repr(a.answer)}")


def print_table(answered: Sequence[Answered], mode: str) -> None:
    print(f"\nanswers {mode}")
    print(f"{'category':<14} {'right':>7} {'share':>6} {'asked again':>12} {'p50 ms':>7}")
    for t in by_category(answered):
        print(f"{t.name:<14} {f'{t.right}/{t.count}':>7} {t.accuracy:6.0%} "
              f"{t.asked_again:12d} {t.median_ms:7.0f}")
    print(f"target: at least {TARGET:.0%} right through speech")


def report(answered: Sequence[Answered], mode: str, options: Options) -> dict[str, Any]:
    tallies = by_category(answered)
    return {
        "mode": mode,
        "system": options.system,
        "overrides": options.overrides,
        "accuracy": tallies[-1].accuracy,
        "median_latency_ms": tallies[-1].median_ms,
        "categories": [{**asdict(t), "accuracy": t.accuracy} for t in tallies],
        "answers": [{"category": a.question.category, "question": a.question.question,
                     "heard": a.heard, "answer": a.answer, "right": a.right,
                     "asked_again": a.asked_again, "latency_ms": a.latency_ms}
                    for a in answered],
    }


def add_parser(bench_cmd: Any) -> None:
    """`omnivox bench answers`' flags."""
    answers = bench_cmd.add_parser(
        "answers", help="share of the question set the local profile's Thinker answers right")
    answers.add_argument("--through", choices=("text", "speech"), default="text",
                         help="type the questions, or say them (default: text)")
    answers.add_argument("--limit", type=int, default=None, help="the first N questions only")
    answers.add_argument("--max-tokens", type=int, default=64,
                         help="reply length cap, as a call's (default: 64)")
    answers.add_argument("--system", help="the system message (default: a call's default "
                         "instructions; '' for none, the Thinker's own prompt then)")
    answers.add_argument("--no-examples", action="store_true",
                         help="without the Thinker's worked examples")
    answers.add_argument("--temperature", type=float, help="instead of the profile's")
    answers.add_argument("--ask-again-below", type=float,
                         help="ask the caller to repeat below this mean log-probability of the "
                         "words heard, instead of the Thinker's (-inf: never)")
    answers.add_argument("--json", dest="json_path", type=Path, help="also write the figures here")


def command(args: Any, settings: Any) -> int:
    """`omnivox bench answers` from its parsed flags."""
    from agent.config import DEFAULT_INSTRUCTIONS

    system = DEFAULT_INSTRUCTIONS if args.system is None else args.system
    overrides: dict[str, Any] = {}
    if args.no_examples:
        overrides["examples"] = []
    if args.temperature is not None:
        overrides["temperature"] = args.temperature
    if args.ask_again_below is not None:
        overrides["ask_again_below"] = args.ask_again_below
    return run(Options(Path(settings.models_dir), args.through == "speech", args.limit,
                       args.max_tokens, args.json_path, system, overrides))
