"""The vLLM internals `pipeline/engines/vllm_internals.py` relies on are still where it looks.

Read from the installed vLLM's classes and source, without starting an engine: an upgrade that
moves one fails here, naming it, instead of in a worker at run time.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys

import psutil
import pytest

from pipeline.engines import vllm_internals, vllm_plugin

ADAPTER = "pipeline/engines/vllm_internals.py"


def platform_is_cpu() -> bool:
    """Whether vLLM's platform (what an engine's "auto" device resolves to) is the CPU."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def assert_sets(cls: type, attribute: str) -> None:
    """`cls.__init__` assigns `self.<attribute>`."""
    source = inspect.getsource(cls.__init__)
    assert f"self.{attribute} =" in source or f"self.{attribute}:" in source, (
        f"{cls.__module__}.{cls.__qualname__}.__init__ no longer sets self.{attribute}, "
        f"which {ADAPTER} reads")


def test_async_llm_keeps_its_output_processor_handler_config_and_errored() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    for attribute in ("output_processor", "output_handler", "vllm_config"):
        assert_sets(AsyncLLM, attribute)
    errored = inspect.getattr_static(AsyncLLM, "errored", None)
    assert isinstance(errored, property), (
        f"vllm.v1.engine.async_llm.AsyncLLM.errored is no longer a property ({errored!r}), "
        f"which {ADAPTER} reads")


def test_output_processor_keeps_request_states_of_request_state_objects() -> None:
    from vllm.v1.engine.output_processor import OutputProcessor, RequestState

    assert_sets(OutputProcessor, "request_states")
    assert "request_states: dict[str, RequestState]" in inspect.getsource(
        OutputProcessor.__init__), "OutputProcessor.request_states no longer maps to RequestState"
    assert "external_req_id" in inspect.signature(RequestState.__init__).parameters, (
        "vllm.v1.engine.output_processor.RequestState no longer takes external_req_id")
    assert_sets(RequestState, "external_req_id")


def test_device_config_says_the_engine_device() -> None:
    from vllm.config import DeviceConfig

    names = {field.name for field in dataclasses.fields(DeviceConfig)}
    assert "device_type" in names, (
        f"vllm.config.DeviceConfig has no device_type field any more, which {ADAPTER} reads")
    auto = DeviceConfig(device="auto")
    assert (auto.device_type == "cpu") == platform_is_cpu(), (
        f"DeviceConfig('auto').device_type is {auto.device_type!r} but "
        f"current_platform.is_cpu() is {platform_is_cpu()}")


def test_cpu_binding_is_still_read_from_the_environment() -> None:
    import vllm.envs

    for name in (vllm_internals.CPU_BIND_ENV, vllm_internals.MULTIPROCESSING_ENV):
        assert name in vllm.envs.environment_variables, f"vLLM no longer reads {name}"


def test_engine_creation_sets_the_variables_for_one_creation_and_restores_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name, threads = vllm_internals.CPU_BIND_ENV, vllm_internals.OMP_THREADS_ENV
    single, freeze = vllm_internals.MULTIPROCESSING_ENV, vllm_plugin.FREEZE_AT_EXIT
    for variable in (name, threads, single, freeze):
        monkeypatch.delenv(variable, raising=False)
    with vllm_internals.engine_creation("1"):
        assert (os.environ[name], os.environ[threads], os.environ[single]) == ("1", "1", "0")
        assert os.environ[freeze] == "1"
    assert not {name, threads, single, freeze} & set(os.environ)
    monkeypatch.setenv(name, "0-1")
    with vllm_internals.engine_creation(None):
        assert os.environ[name] == "0-1" and threads not in os.environ
    with vllm_internals.engine_creation("0"):
        assert os.environ[name] == "0"
    assert os.environ[name] == "0-1"
    with vllm_internals.engine_creation("nobind", 1):
        assert (os.environ[name], os.environ[threads]) == ("nobind", "1")
    assert (os.environ[name], os.environ.get(threads)) == ("0-1", None)
    monkeypatch.setenv(single, "1")  # the operator's choice stands
    with vllm_internals.engine_creation(None):
        assert os.environ[single] == "1"


def test_engine_creation_confines_what_it_spawned_to_the_cores() -> None:
    """A process started inside the creation (as the engine core is) ends it confined to the
    cores, every thread of it; the creating thread and a process started before keep theirs."""
    before = os.sched_getaffinity(0)
    core = min(before)
    sleep = [sys.executable, "-c", "import threading, time; "
             "threading.Thread(target=time.sleep, args=(60,)).start(); "
             "print('ready', flush=True); time.sleep(60)"]
    older = subprocess.Popen(sleep)
    try:
        with vllm_internals.engine_creation(str(core)):
            spawned = subprocess.Popen(sleep, stdout=subprocess.PIPE, text=True)
            assert spawned.stdout is not None
            assert spawned.stdout.readline() == "ready\n"  # its second thread is running
        try:
            threads = psutil.Process(spawned.pid).threads()
            assert len(threads) == 2
            assert all(os.sched_getaffinity(t.id) == {core} for t in threads)
            assert os.sched_getaffinity(0) == before
            assert os.sched_getaffinity(older.pid) == before
        finally:
            spawned.kill()
            spawned.communicate()
    finally:
        older.kill()
        older.wait()


def test_core_lists_are_read_as_vllm_writes_them() -> None:
    assert vllm_internals.cpu_list("0-2,5") == {0, 1, 2, 5}
    assert vllm_internals.cpu_list("1") == {1}
    for unbound in (None, "auto", "nobind"):
        assert vllm_internals.cpu_list(unbound) is None
    with pytest.raises(ValueError, match="no '\\|' ranks"):
        vllm_internals.cpu_list("0|1")


def test_the_cpu_platform_keeps_the_model_in_the_engine_core_at_zero() -> None:
    """The CPU platform turns the single-process executor into the multiprocess one only
    when VLLM_ENABLE_V1_MULTIPROCESSING is 1, and AsyncLLM's engine core is a process of its
    own whatever it says: a kill -9 of the engine still leaves the stage worker standing."""
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.engine.async_llm import AsyncLLM

    source = inspect.getsource(CpuPlatform.check_and_update_config)
    assert (f'os.environ.get("{vllm_internals.MULTIPROCESSING_ENV}", "1") == "1"' in source
            and 'distributed_executor_backend = "mp"' in source), (
        "CpuPlatform.check_and_update_config no longer switches the executor on "
        f"{vllm_internals.MULTIPROCESSING_ENV}, which {ADAPTER} sets")
    assert "make_async_mp_client" in inspect.getsource(AsyncLLM.__init__), (
        "AsyncLLM no longer always runs its engine core in a process of its own")


def test_an_engine_given_threads_keeps_them_for_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM leaves torch's thread count alone when OMP_NUM_THREADS is set from outside: that is
    how a bound engine gets one thread per core and the local profile's unbound Thinker its
    cpu_threads."""
    import torch
    from vllm.utils.torch_utils import set_torch_threads_for_runtime

    before = torch.get_num_threads()
    monkeypatch.setenv(vllm_internals.OMP_THREADS_ENV, "3")
    try:
        torch.set_num_threads(3)
        set_torch_threads_for_runtime()
        assert torch.get_num_threads() == 3, "vLLM now resets an engine's given thread count"
    finally:
        torch.set_num_threads(before)


def test_seeded_generators_are_still_rewound_by_the_cpu_runner() -> None:
    """The reason a CPU engine gets no per-request seed (VllmEngine._request_seed): once this
    fails, check whether vLLM now skips the rewind for CPU generators, and allow seeds again."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert issubclass(CPUModelRunner, GPUModelRunner), "CPUModelRunner no longer a GPUModelRunner"
    bookkeeping = inspect.getattr_static(CPUModelRunner, "_bookkeeping_sync", None)
    assert bookkeeping is GPUModelRunner.__dict__.get("_bookkeeping_sync"), (
        "CPUModelRunner._bookkeeping_sync is no longer GPUModelRunner's")
    source = inspect.getsource(GPUModelRunner._bookkeeping_sync)
    assert "gen.set_offset(gen.get_offset() - 4)" in source, (
        "GPUModelRunner._bookkeeping_sync no longer rewinds a seeded request's generator")


def test_an_aborted_pooling_request_still_ends_with_empty_data() -> None:
    """`pooling_aborted` reads an abort from the empty tensor vLLM puts in a pooling request's
    final output when it aborts it (pooling outputs carry no finish reason)."""
    import torch
    from vllm.outputs import PoolingOutput, PoolingRequestOutput
    from vllm.v1.engine import output_processor

    source = inspect.getsource(output_processor.OutputProcessor.abort_requests)
    assert "pooling_output=EMPTY_CPU_TENSOR" in source, (
        "OutputProcessor.abort_requests no longer ends an aborted pooling request with "
        f"EMPTY_CPU_TENSOR, which {ADAPTER} reads as the abort")
    assert output_processor.EMPTY_CPU_TENSOR.numel() == 0
    assert "finish_reason" not in inspect.signature(PoolingRequestOutput.__init__).parameters, (
        "PoolingRequestOutput now has a finish reason: read the abort from it instead")

    def final(data: torch.Tensor) -> PoolingRequestOutput:
        return PoolingRequestOutput("r", PoolingOutput(data=data), [], 0, finished=True)

    assert vllm_internals.pooling_aborted(final(output_processor.EMPTY_CPU_TENSOR))
    assert not vllm_internals.pooling_aborted(final(torch.zeros(4)))
