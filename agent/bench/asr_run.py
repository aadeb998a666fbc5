"""Runs `omnivox bench asr`: the corpus made (or found), each configuration heard, tables printed
and the figures written as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.bench.asr import Config, hear_all, summary, three_second, time_split
from agent.bench.asr_confidence import print_asking_again
from agent.bench.asr_corpus import Corpus, Utterance, load_or_build
from agent.bench.asr_voices import RATES, VOICES
from agent.bench.report import write_json

WER_TARGET = 0.10
LATENCY_TARGET_MS = 150.0


@dataclass(frozen=True)
class Options:
    configs: Sequence[Config]
    limit: int | None  # the first N questions (and unfinished sentences) only
    voices: Sequence[str]
    corpus_dir: Path | None
    json_path: str | None
    progress: bool


def run(options: Options) -> int:
    corpus = load_or_build(options.corpus_dir, options.progress)
    utterances = selected(corpus, options.limit, options.voices)
    print(f"corpus: {corpus.directory} ({len(utterances)} of {len(corpus.utterances)} "
          f"utterances)")
    results = [summary(config, hear_all(config, corpus, utterances, options.progress))
               for config in options.configs]
    best = min(range(len(results)), key=lambda i: results[i]["wer"]["question/clean"])
    split = time_split(options.configs[best], corpus, three_second(utterances)[:20])
    print_sweep(results)
    print_groups(results[best])
    print_asking_again(results[best])
    print(f"\nwhere the time goes (median ms, ~3 s clean utterances, {results[best]['config']}): "
          + ", ".join(f"{key} {value:.0f}" for key, value in split.items()))
    if options.json_path:
        write_json(options.json_path, {"corpus": str(corpus.directory),
                                       "utterances": len(utterances), "results": results,
                                       "best_by_clean_wer": results[best]["config"],
                                       "time_split_ms": split})
    return 0


def selected(corpus: Corpus, limit: int | None, voices: Sequence[str]) -> list[Utterance]:
    """The utterances of the questions and sentences below `limit`, said by `voices`."""
    return [u for u in corpus.utterances
            if (limit is None or u.text_index < limit) and (not voices or u.voice in voices)]


def print_sweep(results: Sequence[dict[str, Any]]) -> None:
    """One line per configuration: WER by condition, latency of ~3 s utterances."""
    print(f"\n{'configuration':<56} {'clean':>6} {'noisy':>6} {'unfin.':>6} "
          f"{'3s p50 ms':>9} {'p90':>5} {'cpu p50':>7}")
    for r in results:
        wer = r["wer"]
        lat, cpu = r["latency_3s_ms"], r["cpu_3s_ms"]
        print(f"{r['config']:<56} {wer.get('question/clean', float('nan')):6.3f} "
              f"{wer.get('question/noisy', float('nan')):6.3f} "
              f"{wer.get('unfinished/clean', float('nan')):6.3f} "
              f"{lat.get('p50', float('nan')):9.0f} {lat.get('p90', float('nan')):5.0f} "
              f"{cpu.get('p50', float('nan')):7.0f}")
    print(f"targets: clean WER <= {WER_TARGET:.2f}, 3 s utterance heard within "
          f"{LATENCY_TARGET_MS:.0f} ms of the end of the turn")


def print_groups(result: dict[str, Any]) -> None:
    """WER per voice and condition (rows) for one configuration."""
    wer = result["wer"]
    columns = [("question", "clean"), ("question", "noisy"), ("unfinished", "clean")]
    print(f"\nWER per voice, {result['config']}")
    print(f"{'voice':<12}" + "".join(f"{kind[:5] + '/' + cond:>17}" for kind, cond in columns))
    for voice in [v.name for v in VOICES]:
        cells = [wer.get(f"{kind}/{cond}/{voice}") for kind, cond in columns]
        if any(c is not None for c in cells):
            print(f"{voice:<12}" + "".join(f"{c:>17.3f}" if c is not None else f"{'-':>17}"
                                           for c in cells))
    for rate in RATES:
        cells = [wer.get(f"{kind}/{cond}/{rate}") for kind, cond in columns]
        print(f"{'rate ' + rate:<12}" + "".join(f"{c:>17.3f}" if c is not None else f"{'-':>17}"
                                              for c in cells))


def add_parser(bench_cmd: Any) -> None:
    """`omnivox bench asr`'s flags (lists are comma-separated; every combination is run). The
    defaults are the local profile's recognizer settings."""
    from pipeline.families.kit.speech_recognizer import RecognizerSettings

    profile = RecognizerSettings()
    fallback = "on" if len(profile.temperatures) > 1 else "off"
    window = f"{profile.window_min_s:g}+{profile.silence_after_s:g}"
    asr = bench_cmd.add_parser(
        "asr", help="word error rate and latency of the local profile's speech recognition")
    asr.add_argument("--models", type=_names, default=["tiny.en"],
                     help="tiny.en or CTranslate2 Whisper directories (default: tiny.en)")
    asr.add_argument("--beam", type=_ints, default=[profile.beam_size],
                     help=f"beam sizes (default: {profile.beam_size})")
    asr.add_argument("--fallback", type=_flags, default=[fallback == "on"],
                     help=f"temperature fallback off,on (default: {fallback})")
    asr.add_argument("--prompt", type=_ints, default=[profile.prompt_lines],
                     help=f"conversation lines prompting Whisper (default: {profile.prompt_lines})")
    asr.add_argument("--window", type=_windows,
                     default=[(profile.window_min_s, profile.silence_after_s)],
                     help=f"short windows MIN+SILENCE seconds (default: {window})")
    asr.add_argument("--lead", type=_floats, default=[profile.silence_before_s],
                     help="seconds of silence put before each utterance "
                     f"(default: {profile.silence_before_s:g})")
    asr.add_argument("--threads", type=int, default=profile.threads,
                     help=f"CTranslate2 threads (default: {profile.threads})")
    asr.add_argument("--limit", type=int, default=None, help="the first N texts only")
    asr.add_argument("--voices", type=_names, default=[], help="these voices only")
    asr.add_argument("--corpus-dir", type=Path, default=None,
                     help="where the corpus is made (default: ~/.cache/omnivox/asr-corpus)")
    asr.add_argument("--json", dest="json_path", help="also write the figures here")
    asr.add_argument("--no-progress", action="store_true", help="no progress bars")


def command(args: Any, _settings: Any) -> int:
    """`omnivox bench asr` from its parsed flags."""
    from agent.bench.asr import configs

    return run(Options(
        configs(args.models, args.beam, args.fallback, args.prompt, args.window, args.lead,
                args.threads),
        args.limit, args.voices, args.corpus_dir, args.json_path, not args.no_progress))


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _ints(text: str) -> list[int]:
    return [int(part) for part in _names(text)]


def _floats(text: str) -> list[float]:
    return [float(part) for part in _names(text)]


def _flags(text: str) -> list[bool]:
    return [part in ("on", "yes", "1", "true") for part in _names(text)]


def _windows(text: str) -> list[tuple[float, float]]:
    pairs = [part.split("+") for part in _names(text)]
    return [(float(least), float(silence)) for least, silence in pairs]
