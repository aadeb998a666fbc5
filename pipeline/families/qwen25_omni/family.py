"""The qwen25_omni family's stages by name (the package imports them on first use)."""

from pipeline.families.qwen25_omni.talker import OmniTalker
from pipeline.families.qwen25_omni.thinker import OmniThinker
from pipeline.families.qwen25_omni.voicebox import OmniVoiceBox

STAGES = {"thinker": OmniThinker, "talker": OmniTalker, "voicebox": OmniVoiceBox}
