"""The vLLM internals `pipeline/engines/vllm_internals.py` relies on are still where it looks.

Read from the installed vLLM's classes and source, without starting an engine: an upgrade that
moves one fails here, naming it, instead of in a worker at run time.
"""

from __future__ import annotations

import dataclasses
import inspect
import os

import pytest

from pipeline.engines import vllm_internals

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

    assert vllm_internals.CPU_BIND_ENV in vllm.envs.environment_variables, (
        f"vLLM no longer reads {vllm_internals.CPU_BIND_ENV}")


def test_cpu_binding_sets_the_variable_for_one_creation_and_restores_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = vllm_internals.CPU_BIND_ENV
    monkeypatch.delenv(name, raising=False)
    with vllm_internals.cpu_binding("1"):
        assert os.environ[name] == "1"
    assert name not in os.environ
    monkeypatch.setenv(name, "0-1")
    with vllm_internals.cpu_binding(None):
        assert os.environ[name] == "0-1"
    with vllm_internals.cpu_binding("0"):
        assert os.environ[name] == "0"
    assert os.environ[name] == "0-1"
    threads = vllm_internals.OMP_THREADS_ENV
    monkeypatch.delenv(threads, raising=False)
    with vllm_internals.cpu_binding("nobind", 1):
        assert (os.environ[name], os.environ[threads]) == ("nobind", "1")
    assert (os.environ[name], os.environ.get(threads)) == ("0-1", None)


def test_an_unbound_engine_keeps_the_thread_count_it_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With "nobind" vLLM's CPU executor must leave OMP_NUM_THREADS alone: that is how the
    local profile's unbound Thinker gets one thread (cpu_threads)."""
    from types import SimpleNamespace

    from vllm.utils.ompmultiprocessing import OMPProcessManager

    if not platform_is_cpu():
        pytest.skip("OMPProcessManager configures nothing off the CPU platform")
    threads = vllm_internals.OMP_THREADS_ENV
    monkeypatch.setenv(vllm_internals.CPU_BIND_ENV, "nobind")
    monkeypatch.setenv(threads, "3")
    parallel = SimpleNamespace(local_world_size=1, data_parallel_rank_local=0,
                               _api_process_count=1)
    manager = OMPProcessManager(SimpleNamespace(parallel_config=parallel,
                                                kv_transfer_config=None))
    with manager.configure_omp_envs(rank=0, local_rank=0):
        assert os.environ[threads] == "3", "vLLM now sets OMP_NUM_THREADS of an unbound engine"


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
