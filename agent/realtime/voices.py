"""Whether a session's voice is one its model speaks: checked when a call starts (the offer's
session, the server's own voice on the version the call pins) and when a session.update names
one, so an unknown name is refused there instead of failing the next reply."""

from __future__ import annotations

from typing import Any

from agent.realtime.session_config import SessionConfigError
from pipeline.families.voices import family_voices

VOICE_PARAM = "session.audio.output.voice"


class UnknownVoiceError(SessionConfigError):
    """A session's voice its model does not speak (the message names the ones it does)."""

    param = VOICE_PARAM


def unknown_voice(voice: str, pipeline: Any) -> str | None:
    """Why `voice` cannot be spoken by `pipeline` (a call's binding or a bare pipeline), or
    None when it can, or when only the loaded release knows its voices (a stand-in pipeline
    with no settings included)."""
    family = getattr(getattr(pipeline, "settings", None), "family", None)
    voices = family_voices(family) if isinstance(family, str) else None
    if voices is None or voice in voices:
        return None
    return f"voice {voice!r} is not one of this model's voices: {', '.join(voices)}"


def check_voice(voice: str, pipeline: Any) -> None:
    """UnknownVoiceError when `pipeline` cannot speak `voice` (see unknown_voice)."""
    refused = unknown_voice(voice, pipeline)
    if refused is not None:
        raise UnknownVoiceError(refused)
