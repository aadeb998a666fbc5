"""omnivox's vLLM general plugin: the entry point `omnivox` of the `vllm.general_plugins` group
(pyproject.toml), which vLLM loads in every process that builds an engine, its engine core
included (`EngineCore.__init__` calls `vllm.plugins.load_general_plugins`).

It does one thing, and only in the engine processes omnivox starts (`FREEZE_AT_EXIT` is set
while `vllm_internals.engine_creation` holds): it freezes the garbage collector's heap at exit.
By then the engine core has shut down (run_engine_core's `finally`); left unfrozen, the cyclic
collection of torch's and vLLM's objects during interpreter finalization took 1.5-2 s of CPU on
every engine stop, which the stage worker stopping the engine waits for (a tiny engine's stop:
2.7-3.3 s, 1.0-1.1 s frozen). vLLM does the same on ROCm after a clean shutdown; the operating
system reclaims the frozen heap as the process exits.
"""

from __future__ import annotations

import atexit
import gc

from pipeline import environment

FREEZE_AT_EXIT = "OMNIVOX_ENGINE_FREEZE_AT_EXIT"


def register() -> None:
    """vLLM's plugin hook: freeze the heap at exit where omnivox started this engine process."""
    if environment.get(FREEZE_AT_EXIT) == "1":
        atexit.register(gc.freeze)
