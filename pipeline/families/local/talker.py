"""The local family's Talker stage: a chunk of reply text to Piper phoneme-id groups.

The text is made speakable (markup and emoji dropped), cut into phrases at clause punctuation
and phonemized by espeak-ng. Phrases are handed on in groups, each group a whole id sequence
(BOS ... EOS) that the VoiceBox renders on its own: the first group closes at the first phrase
boundary past `job.first_group` phonemes, so the first audio can start early; later groups
close past `job.group` phonemes. Short phrases ("Yes,") thus join the next one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from pipeline.families.local.phonemizer import EspeakPhonemizer, PhonemeMap
from pipeline.families.local.speech_text import speakable, split_phrases
from pipeline.families.local.stage_support import voice_files
from pipeline.families.voices import FAMILY_VOICES
from pipeline.stage import Stage, StageContext, TalkerJob, TalkerOutput


def group_phrases(phonemes: list[str], first_group: int, group: int) -> list[str]:
    """Join phrases' IPA into groups: each closes at the first phrase past its size."""
    groups: list[str] = []
    current: list[str] = []
    size, threshold = 0, first_group
    for phrase in phonemes:
        if not phrase:
            continue
        current.append(phrase)
        size += len(phrase.replace(" ", ""))
        if size >= threshold:
            groups.append(" ".join(current))
            current, size, threshold = [], 0, group
    if current:
        groups.append(" ".join(current))
    return groups


VOICES = FAMILY_VOICES["local"]  # en_US-joe-medium


class LocalTalker(Stage[TalkerJob, TalkerOutput]):
    """Talker on espeak-ng phonemes for the Piper voice en_US-joe-medium."""

    name = "talker"

    async def start(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self.phonemes = PhonemeMap.from_config(voice_files(ctx)[1])
        self.phonemizer = EspeakPhonemizer(
            str(ctx.settings.get("espeak_voice", self.phonemes.espeak_voice)))
        self.active: set[str] = set()
        self.aborted: set[str] = set()

    async def stream(self, job: TalkerJob) -> AsyncIterator[TalkerOutput]:
        if job.voice not in VOICES:  # one Piper voice: another name is the client's mistake
            raise ValueError(f"unknown voice {job.voice!r}; this family has {list(VOICES)}")
        rid = job.request_id
        self.active.add(rid)
        try:
            phonemes = await self.phonemizer.phonemize(split_phrases(speakable(job.text)))
            groups = group_phrases(phonemes, job.first_group, job.group)
            if rid in self.aborted or not groups:
                reason = "abort" if rid in self.aborted else "stop"
                yield TalkerOutput(rid, finished=True, finish_reason=reason)
                return
            for index, group in enumerate(groups):
                last = index == len(groups) - 1
                yield TalkerOutput(rid, tokens=self.phonemes.to_ids(group), finished=last,
                                   finish_reason="stop" if last else None)
                if rid in self.aborted and not last:
                    yield TalkerOutput(rid, finished=True, finish_reason="abort")
                    return
        finally:
            self.active.discard(rid)
            self.aborted.discard(rid)

    async def abort(self, request_ids: list[str]) -> None:
        """Mark these requests: their streams end at the next group (phonemizing is ms)."""
        self.aborted.update(rid for rid in request_ids if rid in self.active)

    def active_request_ids(self) -> list[str]:
        return sorted(self.active)
