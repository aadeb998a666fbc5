"""Whether a session's voice is one its model speaks: checked when a session.update names one,
so an unknown name is refused there instead of failing the next reply."""

from __future__ import annotations

from typing import Any

from pipeline.families.voices import family_voices

VOICE_PARAM = "session.audio.output.voice"


def unknown_voice(voice: str, pipeline: Any) -> str | None:
    """Why `voice` cannot be spoken by `pipeline` (a call's binding or a bare pipeline), or
    None when it can, or when only the loaded release knows its voices (a stand-in pipeline
    with no settings included)."""
    family = getattr(getattr(pipeline, "settings", None), "family", None)
    voices = family_voices(family) if isinstance(family, str) else None
    if voices is None or voice in voices:
        return None
    return f"voice {voice!r} is not one of this model's voices: {', '.join(voices)}"
