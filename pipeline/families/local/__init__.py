"""The local family: a CPU-only voice agent from packaged weights, no model hub.

Thinker: Whisper tiny.en (faster-whisper / CTranslate2) hears the caller, SmolLM2-135M-Instruct
on vLLM answers. Talker: espeak-ng phonemes for the Piper voice. VoiceBox: the Piper VITS
voice en_US-joe-medium on onnxruntime, 22.05 kHz. `build` prepares the model directory.
"""

from pipeline.families.local.build import build_local
from pipeline.families.local.talker import LocalTalker
from pipeline.families.local.thinker import LocalThinker
from pipeline.families.local.voicebox import LocalVoiceBox

STAGES = {"thinker": LocalThinker, "talker": LocalTalker, "voicebox": LocalVoiceBox}
build = build_local
RECOGNISES_SPEECH = True  # its Thinker writes what the caller said (Whisper): transcriptions

__all__ = ["RECOGNISES_SPEECH", "STAGES", "LocalTalker", "LocalThinker", "LocalVoiceBox", "build",
           "build_local"]
