"""The qwen25_omni model family: Qwen2.5-Omni's thinker, talker and token2wav on omnivox.

Its stages read a Qwen2.5-Omni release directory (the real one, or the tiny random-weight one
`build` writes) with the same code. See build.py for the built layout.
"""

from pipeline.families.qwen25_omni.build import build_qwen25_omni
from pipeline.families.qwen25_omni.release import check_release
from pipeline.families.qwen25_omni.talker import OmniTalker
from pipeline.families.qwen25_omni.thinker import OmniThinker
from pipeline.families.qwen25_omni.voicebox import OmniVoiceBox

STAGES = {"thinker": OmniThinker, "talker": OmniTalker, "voicebox": OmniVoiceBox}
build = build_qwen25_omni
check_checkpoint = check_release  # a real release, before serving it (--model-path)

__all__ = ["STAGES", "OmniTalker", "OmniThinker", "OmniVoiceBox", "build", "build_qwen25_omni",
           "check_checkpoint"]
