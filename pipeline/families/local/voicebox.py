"""The local family's VoiceBox stage: Piper phoneme-id groups to 22.05 kHz PCM.

Jobs wait in a bounded queue (full: the caller waits) and are rendered one at a time in the
stage's work thread: VITS output of a padded batch cannot be cut back per utterance, so there
is no batching. An aborted job that has not started is dropped; its stream ends without PCM.
Each job's PCM (float32 mono) is clipped, the model's last step, straight into a pool block
leased for it, which the consumer releases.
"""

from __future__ import annotations

import asyncio
import logging

from pipeline.families.kit.queued_voicebox import QueuedVoiceBox
from pipeline.families.kit.work_thread import WorkThread
from pipeline.families.local.piper_voice import PiperVoice
from pipeline.families.local.stage_support import voice_files
from pipeline.stage import StageContext

logger = logging.getLogger(__name__)

SCALE_KEYS = ("noise_scale", "length_scale", "noise_w")


class LocalVoiceBox(QueuedVoiceBox):
    """VoiceBox on the Piper voice en_US-joe-medium (onnxruntime, one thread)."""

    task_label = "renderer"

    async def start(self, ctx: StageContext) -> None:
        self.work = WorkThread(self.name)
        model, config = voice_files(ctx)
        scales = {key: float(ctx.settings[key]) for key in SCALE_KEYS if key in ctx.settings}
        self.voice = await self.work.run(PiperVoice, model, config,
                                         int(ctx.settings.get("threads", 1)), scales)
        self.audio_s = 0.0  # rendered audio and the time it took: the real-time factor
        self.render_s = 0.0
        self._serve(ctx, self.voice.sample_rate)

    async def _render_jobs(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            entry = await self.jobs.get()
            if not entry.waiting:  # aborted (or its caller gone) while waiting
                continue
            began = loop.time()
            try:
                raw = await self.work.run(self.voice.render, entry.job.tokens)
                # Its length is known only now. The clip is a pass of about 12 us per second
                # of audio: cheaper here than a second hop to the work thread.
                with await self.ctx.acquire_tensor(raw.shape, "float32") as lease:
                    PiperVoice.finish(raw, lease.array)
                    pcm = lease.send()
            except Exception as exc:  # one bad job fails, not the stage
                logger.exception("%s: rendering failed", entry.job.request_id)
                entry.fail(exc)
                continue
            self.render_s += loop.time() - began
            self.audio_s += len(raw) / self.sample_rate
            entry.deliver(pcm)

    def _close(self) -> None:
        self.work.close()
