"""Model families: each is a package exposing `STAGES` (stage name -> Stage class) and `build`.

This package is their registry: it finds a family by its name at run time and imports none
itself. Families never import one another (`lint-imports`); what they share is in `kit/`, and a
family that pairs its stages with another's (orpheus speaks what the qwen25_omni or the local
Thinker writes) asks the registry for that family by name (`load_family`, `family_stage`).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.stage import Stage

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


def family_stage(name: str, stage: str) -> Callable[..., Stage[Any, Any]]:
    """The family `name`'s Stage class for `stage` (a Thinker, a Talker, a VoiceBox), looked
    up at run time: how one family runs another's stage beside its own without importing it.
    Its keyword arguments are the options that family's class takes."""
    stages = load_family(name).STAGES
    if stage not in stages:
        raise KeyError(f"family {name!r} has no stage {stage!r} (it has {sorted(stages)})")
    found: Callable[..., Stage[Any, Any]] = stages[stage]
    return found


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
