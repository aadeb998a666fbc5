"""The qwen25_omni family's Thinker stage: Qwen2.5-Omni's thinker on stock vLLM, text out.

Each job is one vLLM request (the thinker LM as a plain Qwen2, `thinker_lm`) whose prompt is
the embedded chat history with the caller's audio run through the audio tower in this worker's
torch thread (`thinker_prompt`). Text streams out as vLLM makes it.

What the Talker gets (job.embeds true), in `ThinkerOutput.embeds`, float32 rows of the
thinker's hidden size computed beside vLLM with the same weights (`thinker_states`; concurrent
calls' reply steps batched, `talker_rows`; vLLM 0.32 cannot hand them over itself:
docs/decisions/talker-rows-from-vllm.md), sent in as many pieces as the pool's blocks need
(`ctx.send_rows`: at the real width, 3584, a 1 MiB block holds 73 rows, fewer than a system
prompt and a second of audio make):

- The FIRST output that carries tokens carries `prompt_tokens + len(token_ids)` rows: first the
  prompt part, `prompt_tokens` rows (final hidden state + input embedding of every prompt row,
  the embedding zero in the audio rows: the reference's `talker_inputs_embeds` before its
  text-bos row), then that output's reply rows.
- Every later output carries exactly `len(token_ids)` rows.
- A reply row is, for each token id in `token_ids`, in order: the final-layer hidden state
  (after the final norm) at that token's position plus that token's input embedding (the
  reference's `thinker_reply_part` rows). Every token gets a row, a stop token (<|im_end|>)
  included; the reference replaces the stop token's row with the text-eos embedding and pads
  after it with the text-pad embedding: that substitution is the Talker's.
- `prompt_tokens` is the prompt's length on every output; outputs without tokens carry none.
  `prompt_rows` says how many leading rows are the prompt part (`prompt_tokens` on the first
  output with tokens, 0 after), which the cascade hands the Talker in `TalkerJob.prompt_rows`.

The caller's words (Whisper beside the audio tower, scored for the end of the turn by this
LM), transcribe-only and recited jobs, JSON-schema replies, the window's fitting and the stage
settings (`temperature`, `ignore_eos`, `tokenizer_ids_only`, `transcribe`, `asr_dir`, `asr`,
`engine`) are every hearing Thinker's: `pipeline/families/kit/audio_thinker.py`. A recited
job's rows are computed as if the thinker had written its tokens after the prompt. Text-only
jobs (job.embeds false) compute no hidden states. With random weights (the tiny release) set
`ignore_eos` so a reply is exactly max_tokens long; real weights stop at <|im_end|>. A
random-weight release whose tokenizer is smaller than its vocabulary (the real widths with the
tiny tokenizer) sets `tokenizer_ids_only`, or its replies are ids no tokenizer reads: no text,
nothing for a text-reading Talker to say.

Torch placement (`torch_placement.Placement`): `states_device`/`states_dtype` for the
hidden-state model (or the embedding table alone), `audio_device`/`audio_dtype` for the audio
tower; the CPU in float32 unless the profile says otherwise (`omni` on a GPU: cuda, bfloat16).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.families.kit.audio_prompt import ThinkerPrompt
from pipeline.families.kit.audio_thinker import AudioThinker
from pipeline.families.kit.batched_work import BatchedWork
from pipeline.families.kit.release_build import release_dir
from pipeline.families.kit.torch_placement import Placement
from pipeline.families.qwen25_omni.build import THINKER_LM, built_family
from pipeline.families.qwen25_omni.talker_rows import TalkerRows, batched_steps
from pipeline.families.qwen25_omni.thinker_lm import read_embed_table
from pipeline.families.qwen25_omni.thinker_prompt import ThinkerPromptBuilder
from pipeline.families.qwen25_omni.thinker_states import ThinkerStates
from pipeline.stage import StageContext, ThinkerJob

AUDIO_BATCH = 16  # utterances the audio tower encodes in one pass at most


class OmniThinker(AudioThinker):
    """Thinker on a Qwen2.5-Omni release: audio tower in torch, LM on vLLM."""

    prompts: ThinkerPromptBuilder

    def __init__(self, talker_rows: bool = True) -> None:
        # False: a Talker that speaks from text (orpheus's, which runs this Thinker through
        # the families registry): no hidden states are computed or sent, and the worker
        # holds only the LM's embedding table beside vLLM.
        self.with_rows = talker_rows

    def lm_dir(self, ctx: StageContext) -> Path:
        return built_family(ctx.models_dir) / THINKER_LM

    async def load(self, ctx: StageContext) -> None:
        family = built_family(ctx.models_dir)
        states = Placement.of(ctx.settings, "states_")
        self.states: ThinkerStates | None = None
        if self.with_rows:
            self.states = await self.torch.run(ThinkerStates.load, family / THINKER_LM,
                                               str(states.device), states.dtype)
            self.steps = batched_steps(self.torch)
            table = self.states.embed_table
        else:  # no hidden states to compute: the embedding table alone, not the whole LM
            table = await self.torch.run(read_embed_table, family / THINKER_LM, states.dtype)
        self.prompts = await self.torch.run(ThinkerPromptBuilder.load, release_dir(family),
                                            self.engine.tokenizer, table,
                                            Placement.of(ctx.settings, "audio_"))
        # Utterances that end while the tower is busy are encoded together when it frees.
        self.encodings = BatchedWork(self.torch, self.prompts.tower.encode_many, AUDIO_BATCH)

    def talker_rows(self, job: ThinkerJob, prompt: ThinkerPrompt) -> TalkerRows | None:
        if self.states is None:
            return None
        return TalkerRows(self.steps, self.states, prompt)
