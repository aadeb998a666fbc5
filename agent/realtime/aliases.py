"""OpenAI's names for what this server serves under its own: the Realtime model, voice and
transcription model names that agent frameworks send by default (the OpenAI Agents SDK's first
`session.update` names `gpt-realtime-2.1`, voice `ash`, `gpt-4o-mini-transcribe`), resolved
through the server's alias table (`settings.aliases`, agent/config.py; a profile's own table in
profiles.toml laid over it: agent/profiles.py). A name this server serves under its own always
wins over an alias. What a name resolved to is told back: `session.updated` carries the resolved
values, the call record keeps each resolution (`aliases`), and the log names it."""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

from agent.config import AliasSettings


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in patterns)


def model_alias(aliases: AliasSettings, name: str) -> bool:
    """Whether the Realtime model `name` means the call's own model (not a pin)."""
    return _matches(name, aliases.models)


def transcription_alias(aliases: AliasSettings, name: str) -> bool:
    """Whether the transcription model `name` means the model's own recogniser."""
    return _matches(name, aliases.transcription_models)


def voice_of(aliases: AliasSettings, name: str, voices: tuple[str, ...] | None,
             server_voice: str) -> str:
    """The voice `name` is spoken with: itself where the family speaks it (or only the loaded
    release knows its voices and no alias names it), else its alias (an empty alias: the
    server's own voice), else itself (then refused by the voice check)."""
    if voices is not None and name in voices:
        return name
    if name in aliases.voices:
        return aliases.voices[name] or server_voice
    return name
