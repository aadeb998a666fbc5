"""A Thinker's sampling for one job: the stage's own settings, then the job's overrides."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.engines.vllm import Sampling
from pipeline.sampling_options import SamplingOptions


def with_options(sampling: Sampling, options: SamplingOptions | None) -> Sampling:
    """`sampling` with whatever the job's `options` set (a text completion's own choices)."""
    if options is None:
        return sampling
    changes: dict[str, Any] = {name: value for name in ("temperature", "top_p", "seed")
                               if (value := getattr(options, name)) is not None}
    if options.stop:
        changes["stop"] = list(options.stop)
    return dataclasses.replace(sampling, **changes)
