"""A request's own sampling choices, as a Thinker job carries them across the wire.

Calls' turns leave them unset (the profile's stage settings decide); a text completion sets
what its client asked for. A `seed` here still never reaches a CPU engine: the engine drops
per-request seeds there (pipeline/engines/vllm.py, `VllmEngine._request_seed`).
"""

from __future__ import annotations

import msgspec


class SamplingOptions(msgspec.Struct, frozen=True):
    """Per-request overrides of the stage's sampling settings; None keeps the stage's."""

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] = []  # strings that end the reply (not included in it)
