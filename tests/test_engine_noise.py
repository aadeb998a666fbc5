"""An engine's start prints no known dependency noise at the default log level, and real
warnings still get through (`pipeline.engines.vllm_noise`).

The engine runs in a subprocess set up as a stage worker is (root logging at INFO), so that
what vLLM's own engine processes print is captured too.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.engines.vllm_noise import (
    LOGGING_CONFIG_ENV,
    NOISE_RECORDS,
    NOISE_WARNING,
    WARNINGS_ENV,
    StartupNoiseFilter,
    quiet_engine_processes,
)

REPO = Path(__file__).resolve().parent.parent
# What the noise looks like in the output, whichever process and format printed it.
NOISE_LINES = [
    "Triton is not installed. triton-cpu is expected on x86 CPUs.",
    "Model Runner V2 requires Triton; using the V1 model runner instead.",
    "Triton not installed or not compatible",
    "Triton not available, find_triton_kernels",
    "torch.distributed.reduce_op` is deprecated",
]
REAL_WARNING = "omnivox test: a real vLLM warning"
REAL_FUTURE_WARNING = "omnivox test: a real FutureWarning"

ENGINE_SCRIPT = textwrap.dedent(f"""
    import asyncio, logging, sys, warnings
    from pathlib import Path

    async def main(models: Path) -> None:
        from pipeline.engines.vllm import EngineSettings, Sampling, VllmEngine
        from pipeline.families.tiny import build_tiny
        from pipeline.families.kit.engine_stage import ENGINE_DEFAULTS

        family = build_tiny(models, progress=False)
        settings = EngineSettings.from_mapping({{
            **ENGINE_DEFAULTS, "model": str(family / "thinker"), "max_model_len": 256,
            "max_num_seqs": 4}})
        engine = await VllmEngine.start(settings)
        try:
            sampling = Sampling(max_tokens=2, ignore_eos=True)
            async for _ in engine.generate("noise-0", [1, 2, 3], sampling):
                pass
            # on a logger the filter watches, and a FutureWarning: both must get through
            logging.getLogger("vllm.platforms.cpu").warning({REAL_WARNING!r})
            warnings.warn({REAL_FUTURE_WARNING!r}, FutureWarning, stacklevel=1)
        finally:
            await engine.stop()

    if __name__ == "__main__":
        # as a stage worker sets itself up (worker_main)
        logging.basicConfig(level="INFO", format="%(asctime)s omnivox-thinker "
                            "%(levelname)s %(name)s: %(message)s")
        asyncio.run(main(Path(sys.argv[1])))
""")


def noise_in(output: str) -> list[str]:
    """The output's lines that are known noise."""
    return [line for line in output.splitlines() if any(n in line for n in NOISE_LINES)]


@pytest.mark.engines
def test_an_engine_start_prints_no_known_noise(tiny_models_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "engine_noise.py"
    script.write_text(ENGINE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in (LOGGING_CONFIG_ENV, WARNINGS_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(script), str(tiny_models_dir)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert not noise_in(output), "\n".join(noise_in(output))
    assert REAL_WARNING in output and REAL_FUTURE_WARNING in output, output[-4000:]
    # vLLM's engine processes still print their other warnings (the filter is exact)
    assert re.search(r"\(EngineCore pid=\d+\) WARNING", output), output[-4000:]


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
