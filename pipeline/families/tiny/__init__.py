"""The tiny model family: random weights from fixed seeds, built locally, for tests and demos.

It exercises every code path a real family uses (vLLM engines from model directories,
prompt embeddings, safetensors, the shared pool) in seconds on a CPU.
"""

from pipeline.families.tiny.build import build_tiny
from pipeline.families.tiny.talker import TinyTalker
from pipeline.families.tiny.thinker import TinyThinker
from pipeline.families.tiny.voicebox import TinyVoiceBox

STAGES = {"thinker": TinyThinker, "talker": TinyTalker, "voicebox": TinyVoiceBox}
build = build_tiny

__all__ = ["STAGES", "TinyTalker", "TinyThinker", "TinyVoiceBox", "build", "build_tiny"]
