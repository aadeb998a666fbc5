"""What a JSON schema may ask of guided decoding here. xgrammar (vLLM's structured outputs)
compiles a string's `maxLength`/`minLength` into a rule that lets raw control characters
through, so the reply can be invalid JSON. Such a schema is refused, naming the keyword and the
way around it (`pattern` or `enum`), rather than answered with JSON that may not parse."""

from __future__ import annotations

from typing import Any

UNSAFE_KEYWORDS = ("maxLength", "minLength")
NAME_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
DATA = ("enum", "const", "default", "examples")  # values, not schemas


def unsafe_keyword(schema: Any, path: str = "", names: bool = False) -> str | None:
    """The path (`properties.city.maxLength`) of the first keyword in `schema` that guided
    decoding cannot honour, or None. `names`: `schema` maps names to schemas (`properties`)."""
    if isinstance(schema, list):
        for index, value in enumerate(schema):
            found = unsafe_keyword(value, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    if not isinstance(schema, dict):
        return None
    for key, value in schema.items():
        step = f"{path}.{key}" if path else key
        if not names and key in UNSAFE_KEYWORDS:
            return step
        if names or key not in DATA:
            found = unsafe_keyword(value, step, names=not names and key in NAME_MAPS)
            if found is not None:
                return found
    return None


REFUSAL = ("string length bounds are not enforced exactly by guided decoding here (the reply "
           "could be invalid JSON); bound the string with `pattern` (e.g. \"^[a-z]{1,12}$\") "
           "or `enum` instead")
