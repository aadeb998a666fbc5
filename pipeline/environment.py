"""Every environment variable omnivox reads or sets outside its settings, in one table.

The server's own settings (`OMNIVOX_*` names such as `OMNIVOX_MAX_CALLS`) are read by
pydantic-settings from `agent.config.Settings` and documented in docs/operations.md; this table
holds the rest: what vLLM's engine processes are told through their environment, what a stage
worker hands its engines, and what the command-line clients read. Product code touches the
environment only through the functions below, which refuse a name not in the table (a test
checks that nothing else reads or writes `os.environ`), so the table is the whole list.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    name: str
    meaning: str
    default: str | None = None  # what omnivox sets unless the operator has set it


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    # Read by the command-line clients (bench calls, rollout, sip).
    Variable("OMNIVOX_API_KEY", "the bearer key the command-line clients send to a server "
             "with API keys (--api-key overrides it)"),
    # Set by a stage worker for its engines.
    Variable("OMNIVOX_RUNTIME_DIR", "the pipeline's runtime directory, handed by a stage "
             "worker to the engines it starts (removed with the pipeline)"),
    # Set for vLLM and the processes it spawns, unless already set.
    Variable("VLLM_HOST_IP", "the address vLLM's engine processes bind", "127.0.0.1"),
    Variable("VLLM_NO_USAGE_STATS", "vLLM sends no usage statistics", "1"),
    Variable("DO_NOT_TRACK", "no library reports usage", "1"),
    Variable("HF_HUB_OFFLINE", "no model hub at run time", "1"),
    Variable("VLLM_WORKER_MULTIPROC_METHOD", "vLLM spawns (never forks) its workers", "spawn"),
    Variable("VLLM_RPC_BASE_PATH", "where vLLM puts its engine processes' ipc sockets: the "
             "pipeline's runtime directory, so a killed engine's sockets go with it"),
    Variable("VLLM_LOGGING_LEVEL", "vLLM's log level; the benches set WARNING", "WARNING"),
    Variable("VLLM_CONFIGURE_LOGGING", "read: 0 means vLLM configures no logging, so no "
             "logging config file is handed to it"),
    Variable("VLLM_LOGGING_CONFIG_PATH", "vLLM's logging config: its default with the filter "
             "of known start-up noise (pipeline/engines/vllm_noise.py)"),
    Variable("PYTHONWARNINGS", "the warnings filter engine processes inherit: the one known "
             "noisy FutureWarning ignored"),
    Variable("VLLM_CPU_OMP_THREADS_BIND", "the cores a CPU engine's threads are bound to, set "
             "while the engine is created"),
    Variable("OMP_NUM_THREADS", "torch's thread count in a bound CPU engine, set while it is "
             "created"),
    Variable("VLLM_ENABLE_V1_MULTIPROCESSING", "0 while an engine is created: a CPU engine runs "
             "its model in its engine core's process, not a third one "
             "(pipeline/engines/vllm_internals.py)"),
    Variable("OMNIVOX_ENGINE_FREEZE_AT_EXIT", "1 while an engine is created: its engine core "
             "freezes its heap at exit instead of collecting it (pipeline/engines/vllm_plugin.py)"),
    Variable("PYTHONUNBUFFERED", "a bench's child commands print as they go", "1"),
    Variable("XDG_CACHE_HOME", "read: where the benches cache synthesized speech "
             "(~/.cache when unset)"),
)}


def _variable(name: str) -> Variable:
    if name not in VARIABLES:
        raise KeyError(f"{name} is not in omnivox's environment table (pipeline/environment.py)")
    return VARIABLES[name]


def get(name: str) -> str | None:
    """The variable's value in this process, or None."""
    return os.environ.get(_variable(name).name)


def put(name: str, value: str | None) -> None:
    """Set the variable for this process and its children (None: remove it)."""
    if value is None:
        os.environ.pop(_variable(name).name, None)
    else:
        os.environ[_variable(name).name] = value


def set_default(name: str, value: str | None = None) -> str:
    """Set the variable unless the operator has: to `value`, else the table's default. Returns
    what it holds now."""
    variable = _variable(name)
    wanted = value if value is not None else variable.default
    if wanted is None:
        raise ValueError(f"{name} has no default; give a value")
    return os.environ.setdefault(name, wanted)


def child_environment(overrides: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with `overrides` (all in the table) laid over it, for a
    child process."""
    for name in overrides:
        _variable(name)
    return {**os.environ, **overrides}
