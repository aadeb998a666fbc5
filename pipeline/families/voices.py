"""The voices each family speaks with, where they are fixed by the family itself, so the API
process can refuse another name when a session asks for it (without importing the family,
which loads torch). A family not named here takes its voices from the release it loads
(qwen25_omni's speakers, Orpheus's prompt names): a name it lacks fails at the first turn."""

from __future__ import annotations

FAMILY_VOICES: dict[str, tuple[str, ...]] = {
    "tiny": ("default", "bright"),  # the random Talker's two speaker embeddings
    "local": ("default",),  # the one Piper voice, en_US-joe-medium
}


def family_voices(family: str) -> tuple[str, ...] | None:
    """The voices of `family`, or None when only its loaded release knows them."""
    return FAMILY_VOICES.get(family)
