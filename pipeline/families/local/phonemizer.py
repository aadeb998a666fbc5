"""Phrases to Piper phoneme ids: IPA from the espeak-ng program, ids from the voice's map.

espeak-ng runs as a separate process (an asyncio subprocess, so the event loop never waits
on it): all of a chunk's phrases go to one process, which writes one line of IPA per clause.
When its clauses do not line up with our phrases (an abbreviation it reads differently), each
phrase is phonemized on its own. Clause punctuation is not in espeak-ng's output; it is put
back from the phrase, as the voice was trained with it ("həlˈoʊ, wˈɜːld.").

A phrase group's id sequence is what Piper voices expect: BOS, then every phoneme's id
followed by the pad id, then EOS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shutil
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.families.local.speech_text import Phrase

logger = logging.getLogger(__name__)

ESPEAK = shutil.which("espeak-ng") or "/usr/bin/espeak-ng"
TIMEOUT_S = 5.0
MAX_PROCESSES = 4  # espeak-ng processes at once; more wait (a few ms each)
BOS, EOS, PAD = "^", "$", "_"
_LANGUAGE_SWITCH = re.compile(r"\([a-z]{2,3}(?:-[a-z0-9]+)?\)")  # "(fr)" around foreign words


class PhonemizerError(RuntimeError):
    """espeak-ng failed, timed out or is missing."""


@dataclass(frozen=True)
class PhonemeMap:
    """A Piper voice's phoneme alphabet: symbol -> ids, and the espeak-ng voice it expects."""

    espeak_voice: str
    ids: dict[str, list[int]]
    num_symbols: int

    @classmethod
    def from_config(cls, config_path: Path) -> PhonemeMap:
        """Read a Piper voice config (`*.onnx.json`); only espeak phonemes are supported."""
        config = json.loads(Path(config_path).read_text())
        if config.get("phoneme_type", "espeak") != "espeak":
            raise ValueError(f"{config_path}: phoneme_type {config['phoneme_type']!r}; "
                             f"only 'espeak' voices are supported")
        ids = {symbol: list(values) for symbol, values in config["phoneme_id_map"].items()}
        for special in (BOS, EOS, PAD):
            if special not in ids:
                raise ValueError(f"{config_path}: phoneme_id_map lacks {special!r}")
        return cls(config["espeak"]["voice"], ids, int(config["num_symbols"]))

    def to_ids(self, phonemes: str) -> list[int]:
        """BOS, each known phoneme's ids then the pad id, EOS; unknown symbols are skipped."""
        ids = [*self.ids[BOS], *self.ids[PAD]]
        for symbol in phonemes:
            mapped = self.ids.get(symbol)
            if mapped is None:
                logger.debug("phoneme %r (U+%04X) is not in the voice's map", symbol,
                             ord(symbol))
                continue
            ids.extend(mapped)
            ids.extend(self.ids[PAD])
        ids.extend(self.ids[EOS])
        return ids


class EspeakPhonemizer:
    """IPA for phrases from the espeak-ng program, in the voice's espeak-ng language."""

    def __init__(self, voice: str, executable: str = ESPEAK, timeout_s: float = TIMEOUT_S,
                 max_processes: int = MAX_PROCESSES) -> None:
        if shutil.which(executable) is None:
            raise PhonemizerError(f"espeak-ng not found ({executable}): install the Debian "
                                  f"package espeak-ng")
        self.voice = voice
        self.executable = executable
        self.timeout_s = timeout_s
        self._slots = asyncio.Semaphore(max_processes)

    async def phonemize(self, phrases: Sequence[Phrase]) -> list[str]:
        """Each phrase's IPA with its terminator put back ("" where espeak-ng says nothing)."""
        if not phrases:
            return []
        text = " ".join(phrase.text + phrase.terminator for phrase in phrases)
        lines = await self._espeak(text)
        if len(lines) != len(phrases):
            logger.debug("espeak-ng cut %d phrases into %d clauses; phonemizing each alone",
                         len(phrases), len(lines))
            alone = await asyncio.gather(*(self._espeak(phrase.text) for phrase in phrases))
            lines = [" ".join(clauses) for clauses in alone]
        return [_with_terminator(line, phrase) for line, phrase in zip(lines, phrases, strict=True)]

    async def _espeak(self, text: str) -> list[str]:
        """One espeak-ng run over `text`: its clauses' IPA, one per output line."""
        async with self._slots:
            try:
                process = await asyncio.create_subprocess_exec(
                    self.executable, "-q", "--ipa", "-b", "1", "-v", self.voice, "--stdin",
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE)
            except OSError as exc:
                raise PhonemizerError(f"cannot run {self.executable}: {exc}") from exc
            try:
                out, err = await asyncio.wait_for(process.communicate(text.encode()),
                                                  self.timeout_s)
            except TimeoutError:
                raise PhonemizerError(f"espeak-ng took over {self.timeout_s} s") from None
            finally:
                if process.returncode is None:  # timed out or cancelled: never leave it behind
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    await process.wait()
        if process.returncode != 0:
            raise PhonemizerError(f"espeak-ng exited with {process.returncode}: "
                                  f"{err.decode(errors='replace').strip()}")
        lines = (_clean(line) for line in out.decode(errors="replace").splitlines())
        return [line for line in lines if line]


def _clean(line: str) -> str:
    """One espeak-ng IPA line as Piper's phonemes: no language switches, NFD, single spaces."""
    line = _LANGUAGE_SWITCH.sub("", line)
    return " ".join(unicodedata.normalize("NFD", line).split())


def _with_terminator(phonemes: str, phrase: Phrase) -> str:
    return phonemes + phrase.terminator if phonemes else ""
