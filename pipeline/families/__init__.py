"""Model families: each is a package exposing `STAGES` (stage name -> Stage class) and `build`."""

from __future__ import annotations

import importlib
import re
from types import ModuleType

_NAME = re.compile(r"[a-z][a-z0-9_]*")


def load_family(name: str) -> ModuleType:
    """Import `pipeline.families.<name>` and check it exposes what a family must."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"family name {name!r}: lower-case letters, digits and _ only")
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise ValueError(f"no model family {name!r} (no module {exc.name})") from None
    if not isinstance(getattr(module, "STAGES", None), dict) or not callable(
        getattr(module, "build", None)
    ):
        raise TypeError(f"family {name!r} must expose STAGES (dict) and build (callable)")
    return module
