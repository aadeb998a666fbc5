"""The orpheus model family: an Orpheus Llama Talker on vLLM and a SNAC 24 kHz VoiceBox.

The Talker speaks the Thinker's text from token-id prompts; its audio ids become SNAC codes,
handed on in windows of whole 7-token frames that the VoiceBox decodes with left context and
lookahead. The Thinker is the qwen25_omni family's by default, or any vLLM chat model
(thinker.py).
"""

from pipeline.families.orpheus.build import build_orpheus
from pipeline.families.orpheus.release import check_release
from pipeline.families.orpheus.talker import OrpheusTalker
from pipeline.families.orpheus.thinker import OrpheusThinker
from pipeline.families.orpheus.voicebox import SnacVoiceBox

STAGES = {"thinker": OrpheusThinker, "talker": OrpheusTalker, "voicebox": SnacVoiceBox}
build = build_orpheus
check_checkpoint = check_release  # a real checkpoint, before serving it (--model-path)

__all__ = ["STAGES", "OrpheusTalker", "OrpheusThinker", "SnacVoiceBox", "build", "build_orpheus",
           "check_checkpoint"]
