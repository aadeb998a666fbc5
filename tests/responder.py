"""A test-only call handler: answers each utterance with a tone (not part of the product)."""

from __future__ import annotations

import asyncio
from typing import Any

from agent.calls.call import Call
from media.vad import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped
from tests.audio_fixtures import tone

TONE_HZ = 440.0


class ToneResponder:
    """Plays `seconds` of tone into the call after every utterance; records what it was given."""

    def __init__(self, call: Call, seconds: float = 1.0) -> None:
        self.call = call
        self.seconds = seconds
        self.utterances: list[SpeechStopped] = []
        self.client_events: list[Any] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def on_speech_started(self, event: SpeechStarted, item_id: str) -> None:
        pass

    def on_speech_heard(self, voiced_ms: int) -> None:
        pass

    def on_speech_stopped(self, event: SpeechStopped, item_id: str) -> None:
        self.utterances.append(event)
        task = asyncio.ensure_future(
            self.call.outbound.write(tone(TONE_HZ, self.seconds, 24_000, 0.3), 24_000)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def on_speech_paused(self, event: SpeechPaused) -> None:
        pass

    def on_speech_resumed(self, event: SpeechResumed) -> None:
        pass

    def on_client_event(self, event: Any) -> None:
        self.client_events.append(event)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
