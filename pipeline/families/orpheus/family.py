"""The orpheus family's stages by name (the package imports them on first use)."""

from pipeline.families.orpheus.talker import OrpheusTalker
from pipeline.families.orpheus.thinker import OrpheusThinker
from pipeline.families.orpheus.voicebox import SnacVoiceBox

STAGES = {"thinker": OrpheusThinker, "talker": OrpheusTalker, "voicebox": SnacVoiceBox}
