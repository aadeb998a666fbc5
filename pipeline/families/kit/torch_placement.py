"""Where a stage's torch part runs: its device and dtype, from the stage's settings.

A family's torch-side parts (Qwen2.5-Omni's audio tower and token2wav, the thinker's
hidden-state model, SNAC) run on the CPU in float32 unless the profile places them elsewhere:
`<prefix>device` ("cpu", "cuda", "cuda:N") and `<prefix>dtype` ("float32", "bfloat16",
"float16"). The `omni` and `orpheus` profiles put them on the GPU in bfloat16 there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Placement:
    """A torch part's device and dtype."""

    device: torch.device
    dtype: torch.dtype

    @classmethod
    def of(cls, settings: Mapping[str, Any], prefix: str = "") -> Placement:
        """The placement the settings `<prefix>device` and `<prefix>dtype` name (default: the
        CPU, float32); a clear error for an unknown dtype or a CUDA device this host lacks."""
        device_name = str(settings.get(f"{prefix}device", "cpu"))
        dtype_name = str(settings.get(f"{prefix}dtype", "float32"))
        if dtype_name not in DTYPES:
            raise ValueError(f"stage setting {prefix}dtype {dtype_name!r}: one of "
                             f"{', '.join(DTYPES)}")
        device = torch.device(device_name)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"stage setting {prefix}device {device_name!r}: torch sees no CUDA "
                             "device here")
        return cls(device, DTYPES[dtype_name])
