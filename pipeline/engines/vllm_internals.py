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
- `engine_creation`: the environment and CPU affinity vLLM's engine processes inherit when
  the engine spawns them; there are no engine arguments for them, and the variables are
  process-wide: they are set for one engine's creation at a time, under a lock, and restored.
  `VLLM_ENABLE_V1_MULTIPROCESSING` is 0 (unless the operator set it): `AsyncLLM` runs its
  engine core in a process of its own whatever it says (`EngineCoreClient.
  make_async_mp_client`), but vLLM's CPU platform (`CpuPlatform.check_and_update_config`)
  turns the single-process executor ("uni") into the multiprocess one ("mp") when it is 1.
  At 0 the model runs inside the engine core's process instead of a third process: one spawn
  and one vLLM import less per engine (the tiny pipeline ready in 17.8 s instead of 24.5 s
  here) and no message-queue hop between scheduler and model on every step (`bench pipeline`
  tiny on 2 cores, the same run: first audio of one turn 57 ms instead of 88 ms, 32 turns at
  17.2 turns/s instead of 8.6). GPU engines on one device get "uni" anyway; several devices
  still get "mp". Without vLLM's multiprocess executor nothing applies
  `VLLM_CPU_OMP_THREADS_BIND` (its `OMPProcessManager` does, for the workers it spawns), so a
  core list binds here the way it binds there: once created, every thread of the engine core
  is confined to those cores (the threads it starts later inherit it; confining the creating
  thread instead would confine the stage worker's own threads started meanwhile), and
  `OMP_NUM_THREADS` is their count (vLLM keeps torch's threads at that when it is set from outside,
  `set_torch_threads_for_runtime`); "nobind" gets the `cpu_threads` given. An engine argument
  for the CPU executor and its binding would replace all of it.
- `runs_on_cpu`: `AsyncLLM.vllm_config.device_config.device_type`, the device the engine was
  configured for (with `vllm.platforms.current_platform.is_cpu()` behind it, which is what
  "auto" resolves from). Upstream offers no public "which device does this engine run on".
- `pooling_aborted`: an aborted pooling request's final output, which vLLM marks only by an
  empty pooled tensor (`OutputProcessor.abort_requests` puts `EMPTY_CPU_TENSOR` there; a
  `PoolingRequestOutput` has no finish reason). A finish reason on pooling outputs would
  replace it.
- `default_logging_config`: `vllm.logger.DEFAULT_LOGGING_CONFIG`, the `dictConfig` vLLM applies
  when no `VLLM_LOGGING_CONFIG_PATH` is given; a file given there replaces it whole, so one that
  only adds a filter (`vllm_noise`) starts from it. A documented default, or a way to add a
  filter without replacing the config, would replace it.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psutil

from pipeline import environment
from pipeline.engines import vllm_plugin

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
OMP_THREADS_ENV = "OMP_NUM_THREADS"  # torch's threads; vLLM sets it only for a bound engine
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
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
def engine_creation(cores: str | None, threads: int | None = None) -> Iterator[None]:
    """Hold the engine-creation lock with the environment the engine's processes inherit:
    VLLM_CPU_OMP_THREADS_BIND set to `cores`; the model in the engine core's process
    (VLLM_ENABLE_V1_MULTIPROCESSING 0, unless the operator set it); for a core list
    OMP_NUM_THREADS their count, for "nobind" `threads`; the heap frozen at the engine core's
    exit (vllm_plugin). All are restored on exit, and the processes the creation spawned (the
    engine core) are then confined to the cores, every thread of them, as vLLM's multiprocess
    executor binds its workers. This process's own threads keep their affinity."""
    cpus = cpu_list(cores)
    if threads is None and cpus:
        threads = len(cpus)
    wanted = {CPU_BIND_ENV: cores, OMP_THREADS_ENV: None if threads is None else str(threads),
              MULTIPROCESSING_ENV: environment.get(MULTIPROCESSING_ENV) or "0",
              vllm_plugin.FREEZE_AT_EXIT: "1"}
    with _CPU_BIND_LOCK:
        previous = {name: environment.get(name) for name in wanted}
        before = {child.pid for child in psutil.Process().children()}
        for name, value in wanted.items():
            if value is not None:
                environment.put(name, value)
        try:
            yield
        finally:
            for name, value in previous.items():
                environment.put(name, value)
        if cpus:
            spawned = [c for c in psutil.Process().children() if c.pid not in before]
            confine(spawned, cpus)


def confine(processes: list[psutil.Process], cpus: set[int]) -> None:
    """Confine every thread of `processes` and their descendants to `cpus` (threads they
    start later inherit it)."""
    for process in processes:
        for member in (process, *process.children(recursive=True)):
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                for thread in member.threads():
                    with contextlib.suppress(ProcessLookupError):
                        os.sched_setaffinity(thread.id, cpus)


def cpu_list(cores: str | None) -> set[int] | None:
    """The cores of a VLLM_CPU_OMP_THREADS_BIND list ("0", "0-3,6"); None for "auto",
    "nobind" or nothing. One engine has one rank: a "|"-separated list of ranks is refused."""
    if cores in (None, "auto", "nobind"):
        return None
    if "|" in cores:
        raise ValueError(f"cpu_cores {cores!r}: one list of cores per engine (no '|' ranks)")
    cpus: set[int] = set()
    for part in cores.split(","):
        first, _, last = part.strip().partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def pooling_aborted(output: Any) -> bool:
    """Whether a pooling request's final output (a `PoolingRequestOutput`) is its abort's,
    which carries no pooled data."""
    return bool(output.finished) and output.outputs.data.numel() == 0


def executor_backend(llm: AsyncLLM) -> str:
    """The executor vLLM chose for the engine's model ("uni": in the engine core's process)."""
    return str(llm.vllm_config.parallel_config.distributed_executor_backend)


def default_logging_config() -> dict[str, Any]:
    """A copy of the logging config vLLM applies by default, as this environment makes it
    (level, stream, colour). Imports vLLM's logger module, and with it vLLM and torch."""
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    return copy.deepcopy(DEFAULT_LOGGING_CONFIG)
