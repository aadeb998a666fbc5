"""The qwen3_omni model family: Qwen3-Omni's thinker, talker and code2wav on omnivox.

Its stages read a Qwen3-Omni release directory (a published Qwen3-Omni-30B-A3B one, or the
tiny random-weight one `build` writes) with the same code:

- Thinker (`thinker.py`): the caller's audio through the audio encoder, the thinker's LM on
  stock vLLM over prompt embeddings (`thinker_lm.py`), and the rows the Talker needs
  (`thinker_rows.py`).
- Talker (`talker.py`): the talker's LM on stock vLLM as a pooling model, one request per frame
  (`talker_lm.py`, docs/decisions/qwen3-omni-talker-on-vllm.md), codebook 0 and the code
  predictor's codebooks 1-15 batched across calls in its worker (`talker_frames.py`,
  `code_predictor.py`).
- VoiceBox (`voicebox.py`): code2wav streamed from the first frame (it is causal) and batched
  across calls (`code2wav.py`).

See build.py for the built layout. The stages (which import vLLM) load on first use
(`family.py`); `build` and the torch-only modules import without them.
"""

from typing import TYPE_CHECKING

from pipeline.families import exports_on_first_use
from pipeline.families.qwen3_omni.build import build_qwen3_omni
from pipeline.families.qwen3_omni.real_widths import write_real_width_release
from pipeline.families.qwen3_omni.release import MODEL_TYPE, check_release

if TYPE_CHECKING:
    from pipeline.families.qwen3_omni.family import (
        STAGES,
        Qwen3OmniTalker,
        Qwen3OmniThinker,
        Qwen3OmniVoiceBox,
    )

build = build_qwen3_omni
write_real_widths = write_real_width_release  # `models build ... --real-widths DIR`
check_checkpoint = check_release  # a real release, before serving it
CHECKPOINT_MODEL_TYPE = MODEL_TYPE  # config.json's model_type in the releases it serves
# Its Thinker writes down what the caller said (Whisper beside it): transcriptions.
RECOGNISES_SPEECH = True

__all__ = ["CHECKPOINT_MODEL_TYPE", "RECOGNISES_SPEECH", "STAGES", "Qwen3OmniTalker",
           "Qwen3OmniThinker", "Qwen3OmniVoiceBox", "build", "build_qwen3_omni",
           "check_checkpoint", "write_real_widths"]

__getattr__ = exports_on_first_use(__name__, ["STAGES", "Qwen3OmniTalker", "Qwen3OmniThinker",
                                              "Qwen3OmniVoiceBox"])
