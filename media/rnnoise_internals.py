"""The one module that reaches pyrnnoise (RNNoise, with its model compiled into the library the
package bundles: nothing is downloaded at run time); each reach is checked and raises
`RnnoiseInternalsError`, naming what is gone and the pyrnnoise version, when an upgrade moved it.
tests/test_noise_reduction.py checks every one of them.

What is used, from `pyrnnoise.rnnoise`, and why:

- `create()` and `destroy(state)`: one denoising state per call (its recurrent network's memory
  and its noise estimate), freed with the denoiser that holds it.
- `FRAME_SIZE` (480) and `SAMPLE_RATE` (48000): RNNoise takes 10 ms at 48 kHz at a time.
- `lib.rnnoise_process_frame(state, out, in)` (the ctypes handle of the bundled library, its
  argument types declared by pyrnnoise): one frame, float samples on int16's scale in and out.
  pyrnnoise's own `process_mono_frame` would do the same, but it casts the result back to int16
  with no clipping: RNNoise's output runs a few percent past its input's peak, so a caller's
  loud (clipping) speech wraps round to full-scale clicks of the opposite sign. Here the floats
  are rounded and clipped instead. An upstream `process_mono_frame` that clipped would retire
  this reach.

The package is imported on first use, not with this module: it brings audiolab along (a
quarter of a second), which the server pays at start, off its event loop (agent/app.py), and
other commands never.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import weakref
from functools import cache
from types import ModuleType
from typing import Any

import numpy as np

FRAME_SIZE = 480  # samples a frame: 10 ms
SAMPLE_RATE = 48_000  # Hz
_FLOAT_P = ctypes.POINTER(ctypes.c_float)


class RnnoiseInternalsError(RuntimeError):
    """pyrnnoise lacks (or changed) something omnivox relies on: an upgrade moved it, and
    media/rnnoise_internals.py needs to follow."""


def pyrnnoise_version() -> str:
    try:
        return importlib.metadata.version("pyrnnoise")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


@cache
def library() -> ModuleType:
    """`pyrnnoise.rnnoise`, every name used here checked: RnnoiseInternalsError otherwise."""
    try:
        module = importlib.import_module("pyrnnoise.rnnoise")
    except (ImportError, OSError) as exc:  # OSError: the bundled library did not load
        raise RnnoiseInternalsError(
            f"pyrnnoise {pyrnnoise_version()}: pyrnnoise.rnnoise cannot be imported ({exc})"
        ) from exc
    for name in ("create", "destroy", "lib"):
        if not hasattr(module, name):
            raise _missing(name)
    if not hasattr(module.lib, "rnnoise_process_frame"):
        raise _missing("lib.rnnoise_process_frame")
    for name, expected in (("FRAME_SIZE", FRAME_SIZE), ("SAMPLE_RATE", SAMPLE_RATE)):
        if getattr(module, name, None) != expected:
            raise RnnoiseInternalsError(
                f"pyrnnoise {pyrnnoise_version()}: pyrnnoise.rnnoise.{name} is "
                f"{getattr(module, name, None)!r}, not {expected}")
    return module


def _missing(name: str) -> RnnoiseInternalsError:
    return RnnoiseInternalsError(
        f"pyrnnoise {pyrnnoise_version()} has no pyrnnoise.rnnoise.{name}")


class Rnnoise:
    """One RNNoise denoising state: 480 samples (48 kHz, int16) at a time, denoised, with the
    probability (0..1) RNNoise gives that the frame holds speech. The state is freed when the
    object goes."""

    def __init__(self) -> None:
        module = library()
        state = module.create()
        if not state:
            raise RnnoiseInternalsError(f"pyrnnoise {pyrnnoise_version()}: create() gave no state")
        self._state: Any = state
        self._process = module.lib.rnnoise_process_frame
        self._buffer = np.zeros(FRAME_SIZE, np.float32)  # denoised in place
        self._pointer = self._buffer.ctypes.data_as(_FLOAT_P)
        self._free = weakref.finalize(self, module.destroy, state)

    def process(self, frame: np.ndarray) -> tuple[np.ndarray, float]:
        """`frame` (FRAME_SIZE int16 samples) denoised, as int16 (rounded, clipped), and the
        probability that it is speech."""
        if frame.shape != (FRAME_SIZE,):
            raise ValueError(f"RNNoise takes {FRAME_SIZE} samples a frame, not {frame.shape}")
        if not self._free.alive:
            raise RuntimeError("this RNNoise state was freed (close())")
        self._buffer[:] = frame
        speech = float(self._process(self._state, self._pointer, self._pointer))
        out = np.clip(np.rint(self._buffer), -32768, 32767).astype(np.int16)
        return out, speech

    def close(self) -> None:
        """Free the state now (idempotent); the object is of no use afterwards."""
        self._free()
