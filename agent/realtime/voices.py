"""Whether a session's voice is one its model speaks: checked when a call starts (the offer's
session, the server's own voice on the version the call pins) and when a session.update names
one, so an unknown name is refused there instead of failing the next reply."""

from __future__ import annotations

from typing import Any

from agent.config import AliasSettings
from agent.realtime.aliases import voice_of
from agent.realtime.session_config import SessionConfigError
from pipeline.families.voices import family_voices

VOICE_PARAM = "session.audio.output.voice"


class UnknownVoiceError(SessionConfigError):
    """A session's voice its model does not speak (the message names the ones it does)."""

    param = VOICE_PARAM


def voices_of(pipeline: Any) -> tuple[str, ...] | None:
    """The voices `pipeline` (a call's binding or a bare pipeline) speaks, or None when only
    the loaded release knows them (a stand-in pipeline with no settings included)."""
    family = getattr(getattr(pipeline, "settings", None), "family", None)
    return family_voices(family) if isinstance(family, str) else None


def spoken_voice(voice: str, pipeline: Any, aliases: AliasSettings, server_voice: str) -> str:
    """The voice `pipeline` speaks when asked for `voice` (an alias resolved: aliases.py)."""
    return voice_of(aliases, voice, voices_of(pipeline), server_voice)


def unknown_voice(voice: str, pipeline: Any) -> str | None:
    """Why `voice` cannot be spoken by `pipeline`, or None when it can or when only the loaded
    release knows its voices."""
    voices = voices_of(pipeline)
    if voices is None or voice in voices:
        return None
    return f"voice {voice!r} is not one of this model's voices: {', '.join(voices)}"


def check_voice(voice: str, pipeline: Any) -> None:
    """UnknownVoiceError when `pipeline` cannot speak `voice` (see unknown_voice)."""
    refused = unknown_voice(voice, pipeline)
    if refused is not None:
        raise UnknownVoiceError(refused)
