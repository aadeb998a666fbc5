"""The tiny family's stages by name (the package imports them on first use)."""

from pipeline.families.tiny.talker import TinyTalker
from pipeline.families.tiny.thinker import TinyThinker
from pipeline.families.tiny.voicebox import TinyVoiceBox

STAGES = {"thinker": TinyThinker, "talker": TinyTalker, "voicebox": TinyVoiceBox}
