"""The qwen3_omni family's Thinker stage: Qwen3-Omni's thinker on stock vLLM, text out.

Each job is one vLLM request (the thinker LM as a plain Qwen3-MoE, `thinker_lm`) whose prompt
is the embedded chat history with the caller's audio run through the audio tower in this
worker's torch thread (`thinker_prompt`, `audio_tower`). Text streams out as vLLM makes it.
Everything a hearing Thinker does alike is the kit's (`pipeline/families/kit/audio_thinker.py`):
the caller's words from Whisper tiny.en beside the tower (`transcribe`), end-of-turn scoring by
this LM (`score_end_of_turn`), transcribe-only and recited jobs, JSON-schema replies
(`response_format`), the history fitted to the window, and the stage settings `temperature`,
`ignore_eos` (set it for the tiny release's random weights: a reply is then exactly max_tokens
long; real weights stop at <|im_end|>), `tokenizer_ids_only`, `transcribe`, `asr_dir`, `asr`
and `engine`.

What the Talker gets (job.embeds true), in `ThinkerOutput.embeds`: float32 rows of the TALKER's
hidden size (`talker_config.text_config.hidden_size`), the thinker's rows already projected
with the release's `talker.text_projection` / `talker.hidden_projection` (`thinker_rows`;
transformers 5.19's `Qwen3OmniMoeForConditionalGeneration.generate` is the reference), sent in
as many pieces as the pool's blocks need (`ctx.send_rows`):

- The FIRST output that carries tokens carries `prompt_rows + len(token_ids)` rows: first the
  prompt part, `prompt_rows` = U + 3 rows, then that output's reply rows.
  - U: every row of every user turn of the prompt (a row whose most recent <|im_start|> is
    followed by the `user` token: `_get_talker_user_parts` and the user mask of generate()),
    in prompt order: at an audio row, hidden_projection(the thinker's state after its first
    `talker_config.accept_hidden_layer` layers, the reference's
    `hidden_states[accept_hidden_layer]`); at every other row, text_projection(the thinker's
    input embedding of the row).
  - 3: text_projection of the thinker's input embeddings of the final assistant header's rows
    (<|im_start|>, assistant, \\n), the first rows of `_get_talker_assistant_parts`.
- Every later output carries exactly `len(token_ids)` rows, `prompt_rows` 0.
- A reply row is, for each token id in `token_ids`, in order, text_projection(the thinker's
  input embedding of that token). Every token gets a row, the stop token (<|im_end|>)
  included; what the reference makes of the last ones (it never feeds the stop token's row:
  tts_eos, then tts_pad, take over) is the Talker's.
- `prompt_tokens` is the prompt's length (usage) on every output; outputs without tokens carry
  no rows. A recited job's rows are those of its tokens as if the thinker had written them.
  Text-only jobs (job.embeds false) make no rows.

The layer-k states need the thinker's forward over the prompt, which vLLM does not hand over
(docs/decisions/talker-rows-from-vllm.md): a torch copy of the thinker's first
`accept_hidden_layer` layers computes them, only when a user turn holds audio, while vLLM
prefills (`thinker_rows`: at the real size that copy holds 24 of 48 layers and the embedding
table, 15.3 B parameters, 28.4 GiB in bfloat16).

Torch placement (`torch_placement.Placement`): `states_device`/`states_dtype` for that copy,
the embedding table and the projections; `audio_device`/`audio_dtype` for the audio tower; the
CPU in float32 unless the profile says otherwise.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.families.kit.audio_prompt import ThinkerPrompt
from pipeline.families.kit.audio_thinker import AudioThinker
from pipeline.families.kit.batched_work import BatchedWork
from pipeline.families.kit.release_build import release_dir
from pipeline.families.kit.torch_placement import Placement
from pipeline.families.qwen3_omni.build import THINKER_LM, built_family
from pipeline.families.qwen3_omni.thinker_prompt import ThinkerPromptBuilder
from pipeline.families.qwen3_omni.thinker_rows import ReplyRows, TalkerInputs, batched_replies
from pipeline.stage import StageContext, ThinkerJob

AUDIO_QUEUE = 16  # utterances the tower takes from its queue at a time (each encoded alone)


class Qwen3OmniThinker(AudioThinker):
    """Thinker on a Qwen3-Omni release: audio tower and the Talker's rows in torch, LM on
    vLLM."""

    prompts: ThinkerPromptBuilder

    def lm_dir(self, ctx: StageContext) -> Path:
        return built_family(ctx.models_dir) / THINKER_LM

    async def load(self, ctx: StageContext) -> None:
        family = built_family(ctx.models_dir)
        release = release_dir(family)
        self.inputs = await self.torch.run(TalkerInputs.load, release, family / THINKER_LM,
                                           Placement.of(ctx.settings, "states_"))
        self.replies = batched_replies(self.torch, self.inputs)
        self.prompts = await self.torch.run(ThinkerPromptBuilder.load, release,
                                            self.engine.tokenizer, self.inputs.embed_table,
                                            Placement.of(ctx.settings, "audio_"))
        self.encodings = BatchedWork(self.torch, self.prompts.tower.encode_many, AUDIO_QUEUE)

    def talker_rows(self, job: ThinkerJob, prompt: ThinkerPrompt) -> ReplyRows:
        return ReplyRows(self.torch, self.inputs, self.replies, prompt)
