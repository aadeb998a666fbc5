"""Model families: each is a package exposing `STAGES` (stage name -> Stage class) and `build`."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

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


def recognises_speech(name: str) -> bool:
    """Whether the family `name` writes down what a speaker said (transcriptions)."""
    return bool(getattr(load_family(name), "RECOGNISES_SPEECH", False))


def exports_on_first_use(package: str, names: Sequence[str],
                         module: str = "family") -> Callable[[str], Any]:
    """A family package's `__getattr__`: `names` (`STAGES` and its stage classes) imported from
    `package.module` when first asked for.

    A family's stages import vLLM; loading them only on first use lets the family's torch-only
    modules (a vocoder, an audio tower) import on a host without vLLM, as
    `omnivox bench gpu-torch` needs. (`build` stays eager: a lazy one would lose to the
    package's `build` submodule, which the import system sets as the same attribute.)
    """
    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
