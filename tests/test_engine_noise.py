"""The filters that keep known dependency noise of an engine's start below the default log
level, and let real warnings through (`pipeline.engines.vllm_noise`). That a real server's
output, its engine processes' included, has none of it: tests/test_serve_process.py."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from pipeline.engines.vllm_noise import (
    LOGGING_CONFIG_ENV,
    NOISE_RECORDS,
    NOISE_WARNING,
    WARNINGS_ENV,
    StartupNoiseFilter,
    quiet_engine_processes,
)

# What the noise looks like in the output, whichever process and format printed it.
NOISE_LINES = [
    "Triton is not installed. triton-cpu is expected on x86 CPUs.",
    "Model Runner V2 requires Triton; using the V1 model runner instead.",
    "Triton not installed or not compatible",
    "Triton not available, find_triton_kernels",
    "torch.distributed.reduce_op` is deprecated",
]


def noise_in(output: str) -> list[str]:
    """The output's lines that are known noise."""
    return [line for line in output.splitlines() if any(n in line for n in NOISE_LINES)]


def _record(name: str, msg: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, None, None)


def test_the_filter_demotes_exactly_the_noise() -> None:
    noise_filter = StartupNoiseFilter()
    for name, msg in NOISE_RECORDS:
        record = _record(name, msg)
        assert not noise_filter.filter(record), (name, msg)  # these loggers are not at DEBUG
        assert record.levelno == logging.DEBUG
    name, msg = sorted(NOISE_RECORDS)[0]
    for other in (_record(name, msg + " (and more)"), _record("vllm.other", msg),
                  _record(name, "something else entirely", logging.ERROR)):
        level = other.levelno
        assert noise_filter.filter(other) and other.levelno == level
    logger = logging.getLogger(name)
    previous = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        assert noise_filter.filter(_record(name, msg)), "shown as DEBUG where DEBUG is on"
    finally:
        logger.setLevel(previous)


def test_the_operators_own_settings_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOGGING_CONFIG_ENV, "/etc/operator-logging.json")
    monkeypatch.setenv(WARNINGS_ENV, "error")
    quiet_engine_processes()
    assert os.environ[LOGGING_CONFIG_ENV] == "/etc/operator-logging.json"
    assert os.environ[WARNINGS_ENV] == "error"


def test_the_warnings_setting_hides_only_that_future_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(WARNINGS_ENV, "")  # restored (or removed) after the test
    monkeypatch.delenv(WARNINGS_ENV)
    monkeypatch.setenv(LOGGING_CONFIG_ENV, "/unused")  # nothing to write for this test
    quiet_engine_processes()
    script = (f"import warnings; warnings.warn({NOISE_WARNING + ', please use ...'!r}, "
              f"FutureWarning); warnings.warn('another', FutureWarning)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ))
    assert "reduce_op" not in done.stderr and "another" in done.stderr, done.stderr
