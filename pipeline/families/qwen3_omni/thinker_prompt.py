"""The Qwen3-Omni thinker's prompt: chat-templated history, embedded, the audio spliced in.

The kit's prompt builder (`kit/audio_prompt.py`) in Qwen3-Omni's format: a user message whose
content is one audio part is written as <|audio_start|><|audio_pad|><|audio_end|>, and the one
<|audio_pad|> becomes one token per audio-tower row (`audio_tower.py`), as the reference
processor (`Qwen3OmniMoeProcessor`) does. The embedding table is the thinker's
(`thinker_rows.TalkerInputs.embed_table`).
"""

from __future__ import annotations

from pipeline.families.kit.audio_prompt import AudioPromptBuilder
from pipeline.families.qwen3_omni.audio_tower import AudioTower

AUDIO = "<|audio_pad|>"


class ThinkerPromptBuilder(AudioPromptBuilder):
    """Messages (+ the caller's audio rows) -> a `ThinkerPrompt`, with the release's audio
    tower."""

    audio_token = AUDIO
    tower_class = AudioTower
