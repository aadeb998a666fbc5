"""A Piper VITS voice run directly with onnxruntime: phoneme ids to float32 PCM.

The model takes one id sequence (BOS ... EOS, see phonemizer.py), its length and three scales
(noise, length, noise_w: the voice config's defaults unless overridden) and returns the
waveform at the config's sample rate. One intra-op thread: cores are scarce and one utterance
is small; the session is used from a single thread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class VoiceScales:
    """The VITS sampling scales: variation, speed (larger is slower) and duration variation."""

    noise_scale: float = 0.667
    length_scale: float = 1.0
    noise_w: float = 0.8

    def as_input(self) -> np.ndarray:
        return np.array([self.noise_scale, self.length_scale, self.noise_w], dtype=np.float32)


class PiperVoice:
    """One loaded Piper voice (ONNX model + config)."""

    def __init__(self, model_path: Path, config_path: Path, threads: int = 1,
                 scales: dict[str, float] | None = None) -> None:
        import onnxruntime

        config = json.loads(Path(config_path).read_text())
        if int(config.get("num_speakers", 1)) != 1:
            raise ValueError(f"{config_path}: multi-speaker voices are not supported")
        self.sample_rate = int(config["audio"]["sample_rate"])
        self.num_symbols = int(config["num_symbols"])
        inference = config.get("inference", {})
        defaults = {key: float(inference[key]) for key in
                    ("noise_scale", "length_scale", "noise_w") if key in inference}
        self.scales = VoiceScales(**{**defaults, **(scales or {})})
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        self.session = onnxruntime.InferenceSession(
            str(model_path), options, providers=["CPUExecutionProvider"])

    def synthesize(self, ids: list[int]) -> np.ndarray:
        """The utterance's mono float32 PCM in [-1, 1] (blocking: run it off the event loop)."""
        return self.finish(self.render(ids))

    def render(self, ids: list[int]) -> np.ndarray:
        """The model's flat output before its last step, the clip (blocking)."""
        if not ids:
            return np.zeros(0, dtype=np.float32)
        if min(ids) < 0 or max(ids) >= self.num_symbols:
            raise ValueError(f"phoneme ids must lie in [0, {self.num_symbols}); "
                             f"got {min(ids)}..{max(ids)}")
        inputs = {
            "input": np.asarray([ids], dtype=np.int64),
            "input_lengths": np.asarray([len(ids)], dtype=np.int64),
            "scales": self.scales.as_input(),
        }
        pcm: np.ndarray = self.session.run(None, inputs)[0].reshape(-1)
        return pcm

    @staticmethod
    def finish(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The last step: `raw` clipped to [-1, 1] as float32, written into `out` if given (a
        pool block's view, so the PCM is never copied after)."""
        if out is None:
            return np.clip(raw, -1.0, 1.0).astype(np.float32, copy=False)
        return np.clip(raw, -1.0, 1.0, out=out)
