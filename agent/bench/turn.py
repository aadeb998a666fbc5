"""`omnivox bench turn`: how long a caller waits for the agent, stage by stage, over real calls.

A real aiortc caller asks espeak-ng questions (made at run time) one after another in one call.
For each turn, every figure is measured from the end of the caller's speech as the server sees
it (the VAD's speech_stopped, when the session starts the turn): the caller's words recognised,
the Thinker's first token, the Talker's first speech tokens, the VoiceBox's first chunk (the
pipeline's own marks, TurnDone.usage), the first reply frame handed to the sender (the session),
and the first reply audio the caller received. The VoiceBox real-time factor is its request
time over the audio it rendered. With --url the server is elsewhere: only what the caller sees
is measured (from the arrival of speech_stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from agent.bench.caller import BenchCaller
from agent.bench.speech import espeak
from agent.config import Settings

log = logging.getLogger(__name__)

QUESTIONS = (
    "What is the capital of France?",
    "How many days are in a week?",
    "What colour is the sky?",
    "Who wrote Romeo and Juliet?",
    "What is the largest ocean on Earth?",
    "How many legs does a spider have?",
    "What do bees make?",
    "Which planet is closest to the sun?",
    "What language do people speak in Spain?",
    "What is the boiling point of water?",
    "What animal says moo?",
    "How many minutes are in an hour?",
)
# (figure, what it is, its target: (statistic, at most) or None). Times are seconds after the
# end of speech.
FIGURES = (
    ("asr_s", "ASR done (transcript)", None),
    ("thinker_first_token_s", "Thinker first token", None),
    ("thinker_prefill_s", "(Thinker's first token after the words)", None),
    ("talker_first_tokens_s", "Talker first speech tokens", None),
    ("voicebox_first_chunk_s", "VoiceBox first chunk", None),
    ("first_frame_sent_s", "first audio frame sent (server)", None),
    ("first_audio_received_s", "first audio received (caller)", ("p50", 1.0)),
    ("voicebox_rtf", "VoiceBox real-time factor", ("p50", 0.5)),
    ("underruns", "underruns per reply (track ran dry)", ("max", 0)),
    ("audio_s", "(reply audio, s)", None),
    ("prompt_tokens", "(Thinker's prompt, tokens)", None),
    ("cached_tokens", "(of it in the prefix cache, tokens)", None),
    ("vad_close_s", "(caller's last sample -> speech_stopped)", None),
)
PAUSE_S = 0.8  # between the end of a reply and the next question
TURN_TIMEOUT_S = 60.0


@contextlib.asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[tuple[str, Any]]:
    """The server for these settings in this process, once ready: (its URL, its app)."""
    import uvicorn

    from agent.app import create_app
    from agent.profiles import build_pipeline

    app = create_app(settings, pipeline=build_pipeline(settings))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the server stopped while starting")
            await asyncio.sleep(0.05)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        await wait_ready(url)
        yield url, app
    finally:
        server.should_exit = True
        await task


async def wait_ready(url: str, timeout_s: float = 600.0) -> None:
    """Poll /readyz until every stage is ready (engines take a while to start)."""
    print(f"omnivox bench: waiting for {url} to be ready (models and engines load)...")
    async with httpx.AsyncClient(base_url=url) as http:
        for _ in range(int(timeout_s * 2)):
            try:
                reply = await http.get("/readyz")
            except httpx.TransportError:  # not listening yet
                reply = None
            if reply is not None and reply.status_code == 200:
                return
            if reply is not None and any(
                    stage["state"] == "failed" for stage in reply.json()["stages"].values()):
                raise RuntimeError(f"the pipeline failed to start: {reply.json()['detail']}")
            await asyncio.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s")


@dataclass
class TurnFigures:
    """One turn's question, answer and figures (None: not measured here)."""

    question: str
    heard: str
    answer: str
    figures: dict[str, float | None]


async def one_turn(caller: BenchCaller, app: Any, n: int, question: str,
                   directory: Path) -> TurnFigures:
    """Ask `question` as the call's n-th turn; wait for the reply to finish playing."""
    pcm, rate = await asyncio.to_thread(espeak, question, directory / "question.wav")
    await caller.say(pcm, rate)
    done = await caller.wait_for("response.done", n, TURN_TIMEOUT_S)
    if done["response"]["status"] != "completed":
        raise RuntimeError(f"turn {n} ended {done['response']['status']}: {done['response']}")
    await caller.wait_for("output_audio_buffer.stopped", n, TURN_TIMEOUT_S)
    transcribed = "conversation.item.input_audio_transcription.completed"
    heard = caller.last(transcribed)[1]["transcript"] if caller.count(transcribed) >= n else ""
    answer = caller.last("response.output_audio_transcript.done")[1]["transcript"]
    stopped_at = caller.last("input_audio_buffer.speech_stopped")[0]
    figures = dict.fromkeys((key for key, _, _ in FIGURES), None)
    if app is not None:
        figures.update(server_figures(app, caller.call_id))
        stopped_at = app.state.calls.get(caller.call_id).handler.last_reply.started_at
    if caller.first_audio_at is not None:
        figures["first_audio_received_s"] = caller.first_audio_at - stopped_at
    if caller.speech_ended_at is not None:
        figures["vad_close_s"] = stopped_at - caller.speech_ended_at
    return TurnFigures(question, heard, answer, figures)


def server_figures(app: Any, call_id: str) -> dict[str, float | None]:
    """The server's record of the call's last reply, in seconds after the end of speech."""
    reply = app.state.calls.get(call_id).handler.last_reply
    usage = reply.usage or {}
    audio_s = usage.get("audio_s") or 0.0
    return {
        "asr_s": usage.get("transcript_s"),
        "thinker_first_token_s": usage.get("first_text_s"),
        "thinker_prefill_s": _since(usage.get("first_text_s"), usage.get("transcript_s")),
        "talker_first_tokens_s": usage.get("first_speech_tokens_s"),
        "voicebox_first_chunk_s": usage.get("first_audio_s"),
        "first_frame_sent_s": (reply.first_frame_at - reply.started_at
                               if reply.first_frame_at is not None else None),
        "voicebox_rtf": usage["voicebox_s"] / audio_s if audio_s else None,
        "audio_s": audio_s,
        "underruns": reply.underruns,
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": usage.get("cached_tokens"),
    }


def _since(mark: float | None, start: float | None) -> float | None:
    return None if mark is None or start is None else mark - start


def summary(turns: list[TurnFigures]) -> dict[str, dict[str, Any]]:
    """p50, p95 and max of each figure over the turns, and whether its target is met."""
    out = {}
    for key, label, target in FIGURES:
        values = [value for t in turns if (value := t.figures[key]) is not None]
        stats: dict[str, Any] = {"label": label, "n": len(values), "p50": None, "p95": None,
                                 "max": None, "target": target, "met": None}
        if values:
            p50, p95 = np.percentile(values, [50, 95]).tolist()
            stats.update(p50=p50, p95=p95, max=float(max(values)))
            if target is not None:
                stats["met"] = stats[target[0]] <= target[1]
        out[key] = stats
    return out


def report(server: str, turns: list[TurnFigures], stats: dict[str, dict[str, Any]]) -> str:
    lines = [f"omnivox bench turn: {server}, {len(turns)} turns, seconds after the end of "
             f"speech (the VAD's speech_stopped)"]
    for n, t in enumerate(turns, 1):
        prefill, prompt = t.figures.get("thinker_prefill_s"), t.figures.get("prompt_tokens")
        lines.append(f"  {n:>2}. heard {t.heard!r} -> {t.answer!r}" + (
            f" (prompt {prompt} tokens, {t.figures['cached_tokens']} cached; first token "
            f"{prefill * 1e3:.0f} ms after the words)" if prefill is not None and prompt else ""))
    lines.append(f"  {'':44} {'p50':>7} {'p95':>7} {'max':>7}  target")
    for stat in stats.values():
        values = (f"{stat[k]:7.3f}" if stat[k] is not None else "    n/a"
                  for k in ("p50", "p95", "max"))
        target = ""
        if stat["met"] is not None:
            (which, limit), met = stat["target"], stat["met"]
            target = f"{which} <= {limit}: {'met' if met else 'MISSED'}"
        lines.append(f"  {stat['label']:44} {' '.join(values)}  {target}")
    return "\n".join(lines)


async def bench_turns(settings: Settings, url: str | None, turns: int) -> dict[str, Any]:
    """Run the benchmark on a server of `settings` (or the one at `url`); its results."""
    profile = settings.profile
    async with contextlib.AsyncExitStack() as stack:
        app = None
        if url is None:
            # Unpacked apart: mypy keeps `url` optional through a tuple assignment.
            served_url, app = await stack.enter_async_context(served(settings))
            url = served_url
        else:
            await wait_ready(url)
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        caller = BenchCaller(url)
        await caller.connect()
        stack.push_async_callback(caller.hang_up)
        results = []
        for n in range(1, turns + 1):
            await asyncio.sleep(PAUSE_S)
            results.append(await one_turn(caller, app, n, QUESTIONS[(n - 1) % len(QUESTIONS)],
                                          directory))
            log.info("turn %d: %s", n, results[-1].figures)
    stats = summary(results)
    server = f"profile {profile!r}" if app is not None else f"the server at {url}"
    print(report(server, results, stats))
    return {"profile": profile if app is not None else None, "url": url if app is None else None,
            "summary": stats, "turns": [vars(t) for t in results]}


def run(settings: Settings, url: str | None, turns: int, json_path: Path | None) -> int:
    """`omnivox bench turn`: print the figures, and write them as JSON to `json_path`."""
    results = asyncio.run(bench_turns(settings, url, turns))
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"omnivox bench: results written to {json_path}")
    return 0
