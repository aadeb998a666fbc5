"""`omnivox bench turn-ends`: when semantic end of turn
(agent/realtime/turn_taking/semantic_turns.py) ends the spoken corpus's turns, against the silence
alone (server_vad, 500 ms).

Each utterance of the corpus (asr_corpus.py: finished questions, and sentences broken off by a
400-800 ms pause, then finished) goes through a call's VAD with the judged pause, followed by
silence. At each pause the local Thinker, started in this process with the profile's settings,
hears the words so far and scores them as a call's turn does (pipeline/families/kit/end_of_turn.py),
timed. Each eagerness is then replayed on those scores: a pause ends the turn when its score
reaches the threshold and the judgement is back before the caller speaks again; a silence as
long as the eagerness's ends it regardless. Reported: how long after the end of a finished
question its turn ends, and how many turns end at a pause inside the speech (cut).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.bench.answers import local_thinker, thinker_settings
from agent.bench.asr_corpus import Corpus, Utterance, load_or_build
from agent.bench.report import write_json
from agent.config import DEFAULT_INSTRUCTIONS
from agent.realtime.turn_taking.semantic_turns import EAGERNESS, PAUSE_MS, TurnEnding
from media.audio_format import FRAME_SAMPLES, SAMPLES_PER_MS
from media.vad import SpeechPaused, SpeechResumed, SpeechStopped, VadConfig, VadSegmenter
from pipeline.stage import ThinkerJob

TAIL_MS = 3_000  # silence after each utterance: longer than any eagerness waits
SERVER_VAD = TurnEnding(threshold=float("inf"), silence_ms=VadConfig().silence_ms)


@dataclass(frozen=True)
class Pause:
    """One pause of an utterance: where the speech before it ended, how long the silence
    lasted, what the Thinker heard and how it scored it, and how long that took."""

    audio_end_ms: int
    silence_ms: int
    heard: str
    end_of_turn: float | None
    judged_ms: float


@dataclass(frozen=True)
class Judged:
    utterance: Utterance
    pauses: tuple[Pause, ...]  # the last is the silence after the utterance


@dataclass(frozen=True)
class Ending:
    """Where one mode ends one utterance's turn."""

    cut: bool  # at a pause inside the speech
    delay_ms: float  # after the speech before that pause ended


def pauses_of(pcm: np.ndarray) -> list[tuple[SpeechPaused, int]]:
    """Each pause of `pcm` (16 kHz) followed by TAIL_MS of silence, with its silence's length,
    as a VAD that marks PAUSE_MS pauses and never closes sees them."""
    vad = VadSegmenter(VadConfig(pause_ms=PAUSE_MS, silence_ms=10_000))
    tail = TAIL_MS * SAMPLES_PER_MS + (-len(pcm)) % FRAME_SAMPLES
    audio = np.concatenate([pcm, np.zeros(tail, np.int16)])
    found: list[tuple[SpeechPaused, int]] = []
    for frame in audio.reshape(-1, FRAME_SAMPLES):
        for event in vad.push(frame):
            if isinstance(event, SpeechResumed) and found:
                paused = found[-1][0]
                found[-1] = (paused, event.audio_ms - paused.audio_end_ms)
            elif isinstance(event, SpeechPaused):
                found.append((event, vad.position_ms - event.audio_end_ms))
            assert not isinstance(event, SpeechStopped)  # silence_ms is beyond the tail
    if found:  # the last silence runs to the end of the audio
        paused = found[-1][0]
        found[-1] = (paused, vad.position_ms - paused.audio_end_ms)
    return found


async def judge_all(utterances: Sequence[Utterance], corpus: Corpus,
                    models_dir: Path) -> list[Judged]:
    """Every utterance's pauses heard and scored by a local Thinker started here, in turn."""
    from tqdm import tqdm

    async with local_thinker(thinker_settings({}), models_dir) as (thinker, pool):
        messages = [{"role": "system", "content": DEFAULT_INSTRUCTIONS}]
        judged = []
        for n, utterance in enumerate(tqdm(utterances, desc="judging pauses", unit="utt")):
            pauses = []
            for i, (paused, silence_ms) in enumerate(pauses_of(corpus.audio(utterance))):
                job = ThinkerJob(f"u{n}-p{i}", messages, audio=pool.write(paused.pcm, 10.0),
                                 transcribe=True, score_end_of_turn=True, embeds=False)
                began, heard, score = time.perf_counter(), "", None
                async for out in thinker.stream(job):
                    if out.transcript is not None:
                        heard, score = out.transcript, out.end_of_turn
                pauses.append(Pause(paused.audio_end_ms, silence_ms, heard, score,
                                    (time.perf_counter() - began) * 1e3))
            judged.append(Judged(utterance, tuple(pauses)))
        return judged


def ending(judged: Judged, mode: TurnEnding) -> Ending:
    """Where `mode` ends the utterance's turn: the first pause it judges whole in time, or
    whose silence lasts as long as the mode waits."""
    last = len(judged.pauses) - 1
    for i, pause in enumerate(judged.pauses):
        answer_ms = PAUSE_MS + pause.judged_ms
        score = pause.end_of_turn if pause.end_of_turn is not None else 0.0
        if score >= mode.threshold and answer_ms < min(pause.silence_ms, mode.silence_ms):
            return Ending(i < last, answer_ms)
        if pause.silence_ms >= mode.silence_ms:
            return Ending(i < last, float(mode.silence_ms))
    raise AssertionError("the tail's silence outlasts every mode's")


def p90(values: Sequence[float]) -> float:
    """The 90th percentile, the nearest value below (as the figures of
    docs/measurements/2026-12-02-semantic-turn-ends.md were taken)."""
    return float(np.percentile(values, 90, method="lower"))


def summary(judged: Sequence[Judged], name: str, mode: TurnEnding) -> dict[str, Any]:
    questions = [ending(j, mode) for j in judged if j.utterance.kind == "question"]
    unfinished = [ending(j, mode) for j in judged if j.utterance.kind == "unfinished"]
    whole = [e.delay_ms for e in questions if not e.cut]
    return {
        "mode": name,
        "threshold": mode.threshold,
        "silence_ms": mode.silence_ms,
        "questions": len(questions),
        "questions_cut": sum(e.cut for e in questions),
        "end_ms_p50": statistics.median(whole) if whole else None,
        "end_ms_p90": p90(whole) if whole else None,
        "unfinished": len(unfinished),
        "unfinished_cut": sum(e.cut for e in unfinished),
    }


def print_table(rows: Sequence[dict[str, Any]], judged: Sequence[Judged]) -> None:
    last = [j.pauses[-1] for j in judged if j.utterance.kind == "question"]
    judged_ms = [p.judged_ms for j in judged for p in j.pauses]
    print(f"\njudgement (hear + score) p50 {statistics.median(judged_ms):.0f} ms, "
          f"p90 {p90(judged_ms):.0f} ms; finished questions scored "
          f">= 0.5 at their end: {sum((p.end_of_turn or 0) >= 0.5 for p in last)}/{len(last)}")
    print(f"\n{'mode':<22} {'ends after a finished question':>30} {'cut':>12} {'cut':>12}")
    print(f"{'':<22} {'p50 ms':>15} {'p90 ms':>14} {'questions':>12} {'unfinished':>12}")
    for r in rows:
        questions_cut = f"{r['questions_cut']}/{r['questions']}"
        unfinished_cut = f"{r['unfinished_cut']}/{r['unfinished']}"
        print(f"{r['mode']:<22} {r['end_ms_p50'] or float('nan'):15.0f} "
              f"{r['end_ms_p90'] or float('nan'):14.0f} {questions_cut:>12} "
              f"{unfinished_cut:>12}")


@dataclass(frozen=True)
class Options:
    models_dir: Path
    limit: int | None
    voices: Sequence[str]
    json_path: Path | None


def run(options: Options) -> int:
    from agent.bench.asr_run import selected
    from pipeline.families.local.build import build_local

    build_local(options.models_dir, False)
    corpus = load_or_build(None, progress=True)
    utterances = [u for u in selected(corpus, options.limit, options.voices)
                  if u.condition == "clean" and u.rate == "normal"]
    judged = asyncio.run(judge_all(utterances, corpus, options.models_dir))
    modes = [("server_vad (500 ms)", SERVER_VAD),
             *((f"semantic_vad {name}", mode) for name, mode in EAGERNESS.items())]
    rows = [summary(judged, name, mode) for name, mode in modes]
    print_table(rows, judged)
    if options.json_path:
        write_json(options.json_path, {"modes": rows, "utterances": [
            {"id": j.utterance.id, "kind": j.utterance.kind, "text": j.utterance.text,
             "pauses": [asdict(p) for p in j.pauses]} for j in judged]})
    return 0


def add_parser(bench_cmd: Any) -> None:
    """`omnivox bench turn-ends`' flags."""
    ends = bench_cmd.add_parser(
        "turn-ends", help="when semantic_vad ends the spoken corpus's turns, against server_vad")
    ends.add_argument("--limit", type=int, default=None,
                       help="the first N questions and unfinished sentences only")
    ends.add_argument("--voice", action="append", default=[],
                       help="only this corpus voice (repeatable; default: all)")
    ends.add_argument("--json", dest="json_path", type=Path, help="also write the figures here")


def command(args: Any, settings: Any) -> int:
    """`omnivox bench turn-ends` from its parsed flags."""
    return run(Options(Path(settings.models_dir), args.limit, args.voice, args.json_path))
