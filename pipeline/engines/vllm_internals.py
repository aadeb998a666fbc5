"""The one place omnivox reaches into vLLM's private or undocumented internals (vLLM 0.32).

Each function below names what it touches, and `tests/test_vllm_internals.py` checks every one
of those names against the installed vLLM, so an upgrade that moves one fails there, by name.
What each touches, and what upstream offers or would take instead:

- `active_request_ids`: `AsyncLLM.output_processor.request_states` (a dict of `RequestState`)
  and `RequestState.external_req_id` (the id the caller gave; vLLM keys its states by an
  internal id with a suffix). Upstream offers only counts (`get_num_unfinished_requests()`);
  a public listing of the unfinished requests' ids would replace it.
- `cancel_output_handler`: `AsyncLLM.output_handler`, the asyncio task that pulls outputs
  from the engine core. `AsyncLLM.shutdown()` cancels it too, but only after stopping the
  engine core, so a planned stop is logged as "AsyncLLM output_handler failed" with a
  traceback. A shutdown that cancels its own task first would replace it.
- `engine_dead`: `AsyncLLM.errored`, a property of vLLM's `EngineClient` interface (the one its
  OpenAI server uses) that is not in the documented API. Upstream's documented signal is
  `EngineDeadError` raised from `generate()`, which only a request in flight sees.
- `cpu_binding`: the process environment's `VLLM_CPU_OMP_THREADS_BIND`, which vLLM's CPU
  workers read when the engine spawns them; there is no engine argument for it. The variable
  is documented, but only process-wide: it is set for one engine's creation at a time, under a
  lock, and restored. A per-engine argument (as `--cpu-omp-threads-bind`) would replace it.
  With "nobind" vLLM leaves `OMP_NUM_THREADS` as it finds it (`OMPProcessManager`), so an
  unbound engine's thread count is set the same way.
- `runs_on_cpu`: `AsyncLLM.vllm_config.device_config.device_type`, the device the engine was
  configured for (with `vllm.platforms.current_platform.is_cpu()` behind it, which is what
  "auto" resolves from). Upstream offers no public "which device does this engine run on".
- `default_logging_config`: `vllm.logger.DEFAULT_LOGGING_CONFIG`, the `dictConfig` vLLM applies
  when no `VLLM_LOGGING_CONFIG_PATH` is given; a file given there replaces it whole, so one that
  only adds a filter (`vllm_noise`) starts from it. A documented default, or a way to add a
  filter without replacing the config, would replace it.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pipeline import environment

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
OMP_THREADS_ENV = "OMP_NUM_THREADS"  # torch's threads; vLLM sets it only for a bound engine
# The environment is the whole process's: two engines created side by side must not see each
# other's binding, so creations that set one take turns.
_CPU_BIND_LOCK = threading.Lock()


def active_request_ids(llm: AsyncLLM) -> list[str]:
    """The caller-given ids of the requests vLLM's front end still tracks, sorted."""
    states = llm.output_processor.request_states
    return sorted({state.external_req_id for state in states.values()})


def cancel_output_handler(llm: AsyncLLM) -> None:
    """Cancel the front end's output task (before a shutdown: see the module docstring)."""
    handler = getattr(llm, "output_handler", None)  # None until the first request
    if handler is not None:
        handler.cancel()


def engine_dead(llm: AsyncLLM) -> bool:
    """Whether the engine can serve no more (its engine core process is gone)."""
    return bool(llm.errored)


def runs_on_cpu(llm: AsyncLLM) -> bool:
    """Whether the engine runs its model on the CPU."""
    return llm.vllm_config.device_config.device_type == "cpu"


@contextmanager
def cpu_binding(cores: str | None, threads: int | None = None) -> Iterator[None]:
    """Hold the engine-creation lock with VLLM_CPU_OMP_THREADS_BIND set to `cores` and
    OMP_NUM_THREADS to `threads` (each left as it is for None); both are restored on exit."""
    wanted = {CPU_BIND_ENV: cores, OMP_THREADS_ENV: None if threads is None else str(threads)}
    with _CPU_BIND_LOCK:
        previous = {name: environment.get(name) for name in wanted}
        for name, value in wanted.items():
            if value is not None:
                environment.put(name, value)
        try:
            yield
        finally:
            for name, value in previous.items():
                environment.put(name, value)


def default_logging_config() -> dict[str, Any]:
    """A copy of the logging config vLLM applies by default, as this environment makes it
    (level, stream, colour). Imports vLLM's logger module, and with it vLLM and torch."""
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    return copy.deepcopy(DEFAULT_LOGGING_CONFIG)
