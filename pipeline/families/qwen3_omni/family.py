"""The qwen3_omni family's stages by name (the package imports them on first use)."""

from pipeline.families.qwen3_omni.talker import Qwen3OmniTalker
from pipeline.families.qwen3_omni.thinker import Qwen3OmniThinker
from pipeline.families.qwen3_omni.voicebox import Qwen3OmniVoiceBox

STAGES = {"thinker": Qwen3OmniThinker, "talker": Qwen3OmniTalker, "voicebox": Qwen3OmniVoiceBox}
