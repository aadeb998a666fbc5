"""The orpheus model family: an Orpheus Llama Talker on vLLM and a SNAC 24 kHz VoiceBox.

The Talker speaks the Thinker's text from token-id prompts; its audio ids become SNAC codes,
handed on in windows of whole 7-token frames that the VoiceBox decodes with left context and
lookahead. The Thinker is the qwen25_omni family's by default, or any vLLM chat model
(thinker.py). The stages (which import vLLM) load on first use (`family.py`); `build` and the
torch-only modules import without them.
"""

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.families import exports_on_first_use
from pipeline.families.orpheus.build import build_orpheus
from pipeline.families.orpheus.release import check_release

if TYPE_CHECKING:
    from pipeline.families.orpheus.family import (
        STAGES,
        OrpheusTalker,
        OrpheusThinker,
        SnacVoiceBox,
    )

build = build_orpheus


def write_real_widths(directory: Path, layers: int = 1, seed: int = 0) -> Path:
    """`models build orpheus --real-widths DIR`: the real-width checkpoint (real_size.py,
    imported here: it needs the snac package, which torch-only hosts may lack)."""
    from pipeline.families.orpheus.real_size import write_real_width_checkpoint

    return write_real_width_checkpoint(directory, layers, seed)


check_checkpoint = check_release  # a real checkpoint, before serving it (--model-path)
# Its Thinker writes down what the caller said (Whisper beside it): transcriptions.
RECOGNISES_SPEECH = True

__all__ = ["RECOGNISES_SPEECH", "STAGES",
           "OrpheusTalker", "OrpheusThinker", "SnacVoiceBox", "build", "build_orpheus",
           "check_checkpoint", "write_real_widths"]

__getattr__ = exports_on_first_use(__name__, ["STAGES", "OrpheusTalker", "OrpheusThinker",
                                              "SnacVoiceBox"])
