"""The qwen25_omni model family: Qwen2.5-Omni's thinker, talker and token2wav on omnivox.

Its stages read a Qwen2.5-Omni release directory (the real one, or the tiny random-weight one
`build` writes) with the same code. See build.py for the built layout. The stages (which import
vLLM) load on first use (`family.py`); `build` and the torch-only modules import without them.
"""

from typing import TYPE_CHECKING

from pipeline.families import exports_on_first_use
from pipeline.families.qwen25_omni.build import build_qwen25_omni
from pipeline.families.qwen25_omni.real_widths import write_real_width_release
from pipeline.families.qwen25_omni.release import MODEL_TYPE, check_release

if TYPE_CHECKING:
    from pipeline.families.qwen25_omni.family import STAGES, OmniTalker, OmniThinker, OmniVoiceBox

build = build_qwen25_omni
write_real_widths = write_real_width_release  # `models build ... --real-widths DIR`
check_checkpoint = check_release  # a real release, before serving it (--model-path)
CHECKPOINT_MODEL_TYPE = MODEL_TYPE  # config.json's model_type in the releases it serves
# Its Thinker writes down what the caller said (Whisper beside it): transcriptions.
RECOGNISES_SPEECH = True

__all__ = ["CHECKPOINT_MODEL_TYPE", "RECOGNISES_SPEECH", "STAGES",
           "OmniTalker", "OmniThinker", "OmniVoiceBox", "build", "build_qwen25_omni",
           "check_checkpoint", "write_real_widths"]

__getattr__ = exports_on_first_use(__name__, ["STAGES", "OmniTalker", "OmniThinker",
                                              "OmniVoiceBox"])
