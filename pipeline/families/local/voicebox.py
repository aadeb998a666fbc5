"""The local family's VoiceBox stage: Piper phoneme-id groups to 22.05 kHz PCM.

Jobs wait in a bounded queue (full: the caller waits) and are rendered one at a time in the
stage's work thread: VITS output of a padded batch cannot be cut back per utterance, so there
is no batching. An aborted job that has not started is dropped; its stream ends without PCM.
Each job's PCM (float32 mono) goes into a pool block, which the consumer releases.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from pipeline.families.local.piper_voice import PiperVoice
from pipeline.families.local.stage_support import WorkThread, pool_timeout, voice_files
from pipeline.stage import Stage, StageContext, VoiceBoxJob, VoiceBoxOutput

logger = logging.getLogger(__name__)

MAX_QUEUED = 256
SCALE_KEYS = ("noise_scale", "length_scale", "noise_w")


@dataclass(eq=False)
class _Pending:
    """A queued job and the future its PCM arrives on (None: aborted)."""

    job: VoiceBoxJob
    result: asyncio.Future[np.ndarray | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class LocalVoiceBox(Stage):
    """VoiceBox on the Piper voice en_US-joe-medium (onnxruntime, one thread)."""

    name = "voicebox"

    async def start(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self.work = WorkThread(self.name)
        model, config = voice_files(ctx)
        scales = {key: float(ctx.settings[key]) for key in SCALE_KEYS if key in ctx.settings}
        self.voice = await self.work.run(PiperVoice, model, config,
                                         int(ctx.settings.get("threads", 1)), scales)
        self.sample_rate = self.voice.sample_rate
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue(
            int(ctx.settings.get("max_queued", MAX_QUEUED)))
        self.pending: dict[str, list[_Pending]] = {}
        self.audio_s = 0.0  # rendered audio and the time it took: the real-time factor
        self.render_s = 0.0
        self.renderer = asyncio.create_task(self._render_loop(), name="voicebox-renderer")

    async def stream(self, job: VoiceBoxJob) -> AsyncIterator[VoiceBoxOutput]:
        entry = _Pending(job)
        self.pending.setdefault(job.request_id, []).append(entry)
        try:
            await self.queue.put(entry)  # full queue: the caller waits (back-pressure)
            pcm = await entry.result
        finally:
            if not entry.result.done():  # cancelled: the renderer skips it
                entry.result.cancel()
            self._forget(entry)
        if pcm is None:
            yield VoiceBoxOutput(job.request_id, finished=True)
            return
        ref = await self.ctx.pool.put(pcm, pool_timeout(self.ctx))
        yield VoiceBoxOutput(job.request_id, pcm=ref, sample_rate=self.sample_rate,
                             finished=True)

    async def abort(self, request_ids: list[str]) -> None:
        """Drop these requests' waiting jobs: their streams end without PCM."""
        for request_id in request_ids:
            for entry in self.pending.get(request_id, []):
                if not entry.result.done():
                    entry.result.set_result(None)

    def active_request_ids(self) -> list[str]:
        return sorted(rid for rid, entries in self.pending.items()
                      if any(not e.result.done() for e in entries))

    async def stop(self) -> None:
        self.renderer.cancel()
        await asyncio.gather(self.renderer, return_exceptions=True)
        self.work.close()

    async def _render_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            entry = await self.queue.get()
            if entry.result.done():  # aborted (or its caller gone) while waiting
                continue
            began = loop.time()
            try:
                pcm = await self.work.run(self.voice.synthesize, entry.job.tokens)
            except Exception as exc:  # one bad job fails, not the stage
                logger.exception("%s: rendering failed", entry.job.request_id)
                if not entry.result.done():
                    entry.result.set_exception(exc)
                continue
            self.render_s += loop.time() - began
            self.audio_s += len(pcm) / self.sample_rate
            if not entry.result.done():
                entry.result.set_result(pcm)

    def _forget(self, entry: _Pending) -> None:
        entries = self.pending.get(entry.job.request_id, [])
        if entry in entries:
            entries.remove(entry)
        if not entries:
            self.pending.pop(entry.job.request_id, None)
