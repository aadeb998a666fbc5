"""The tiny model family: random weights from fixed seeds, built locally, for tests and demos.

It exercises every code path a real family uses (vLLM engines from model directories,
prompt embeddings, safetensors, the shared pool) in seconds on a CPU. The stages (which import
vLLM) load on first use (`family.py`); `build` imports without them.
"""

from typing import TYPE_CHECKING

from pipeline.families import exports_on_first_use
from pipeline.families.tiny.build import build_tiny

if TYPE_CHECKING:
    from pipeline.families.tiny.family import STAGES, TinyTalker, TinyThinker, TinyVoiceBox

build = build_tiny

__all__ = ["STAGES", "TinyTalker", "TinyThinker", "TinyVoiceBox", "build", "build_tiny"]

__getattr__ = exports_on_first_use(__name__, ["STAGES", "TinyTalker", "TinyThinker",
                                              "TinyVoiceBox"])
