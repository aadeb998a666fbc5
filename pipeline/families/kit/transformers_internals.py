"""The one module that reaches into transformers' private or unexported internals (written for
transformers 5.19); each reach is checked and raises `TransformersInternalsError`, naming what
is gone and the installed version, when an upgrade moved it. On another release than the one
it was written for, the first reach logs a warning once (the GPU hosts have run 5.17); the
reaches are checked one by one either way. tests/test_transformers_internals.py checks every
one of them against the installed transformers.

What is reached, why, and what upstream offers or could offer instead:

- `PreTrainedModel._from_config(config, dtype=...)` (`model_from_config`): a model class built
  from a sub-configuration (the Qwen2.5-Omni audio encoder from the thinker's `audio_config`)
  in a dtype, its weights then loaded from the release. The public `from_config` is the Auto
  classes', which map no sub-model's configuration; the class's own constructor ignores the
  dtype (torch's process-wide default would have to be switched around it).
- `Qwen2_5OmniAudioEncoder` and `RungeKutta4ODESolver`, from
  `transformers.models.qwen2_5_omni.modeling_qwen2_5_omni`, which does not export them (its
  `__all__` lists the whole models and their exported parts): the thinker's audio tower run
  alone, and the reference's ODE solver for token2wav's flow matching, used step for step so
  that a window samples as the reference does. Exporting them would retire these reaches.
- `Qwen2_5OmniAudioEncoder._get_feat_extract_output_lengths(lengths)` (`feature_lengths`): an
  utterance's frame count after the encoder's convolutions (its forward's `aftercnn_lens`) and
  after its pooling (the rows it yields). A public method (or the processor's own count)
  would replace it.
- `Qwen2_5OmniToken2WavDiTModel._create_block_diff(hidden_states)` (`block_diff_replaced`):
  the block-distance matrix the DiT's forward builds every layer's attention mask from,
  replaced on one instance for one batched call to hide padded frames from real ones (the
  reference has no key padding mask). A padding-mask argument to the DiT would retire it.
- The parts of Qwen3-Omni's code2wav (`Qwen3OmniMoeCausalConvNet`,
  `Qwen3OmniMoeCausalTransConvNet`, `Qwen3OmniMoeConvNeXtBlock`,
  `Qwen3OmniMoeCode2WavDecoderResidualUnit`, `Qwen3OmniMoeSnakeBeta`), from
  `transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe`, which exports the whole
  `Qwen3OmniMoeCode2Wav` and its decoder block but not them (`code2wav_parts`): the streaming
  renderer (qwen3_omni's code2wav.py) tells its layers apart by these classes, to keep each
  convolution's left context between calls, and refuses a layer it does not know. A streaming
  (stateful) forward upstream would retire it.
- `Qwen3OmniMoeAudioEncoder`, from the same module, which does not export it either
  (`qwen3_audio_encoder_class`): Qwen3-Omni's thinker's audio tower run alone, loaded from the
  release's `thinker.audio_tower.*` without the 30B thinker around it. Exporting it (as
  `Qwen3OmniMoeThinkerTextModel` is) would retire this reach.
- A configuration's `_attn_implementation` (`attention_implementation`): the attention kernel
  its layers dispatch on ("sdpa", "eager", ...); the streaming code2wav batches streams with a
  4-D mask, which only some kernels take. transformers sets it when a model is built and has
  no public reader.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from pipeline.families.kit.library_reach import LibraryReach

WRITTEN_FOR = "5.19"  # the transformers release (major.minor) this module was written for
OMNI_MODELING = "transformers.models.qwen2_5_omni.modeling_qwen2_5_omni"
AUDIO_ENCODER = "Qwen2_5OmniAudioEncoder"
ODE_SOLVER = "RungeKutta4ODESolver"
DIT = "Qwen2_5OmniToken2WavDiTModel"
_FROM_CONFIG = "_from_config"
_FEATURE_LENGTHS = "_get_feat_extract_output_lengths"
_BLOCK_DIFF = "_create_block_diff"
QWEN3_OMNI_MODELING = "transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe"

logger = logging.getLogger(__name__)

# The DiT's block-distance function: hidden states (batch, frames, width) to the distances
# (batch, heads, frames, frames) its layers' attention masks are made from.
BlockDiff = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Code2WavParts:
    """The classes of Qwen3-Omni code2wav's layers that transformers does not export."""

    causal_conv: type[torch.nn.Module]  # a Conv1d (`.conv`) padded on the left only
    transposed_conv: type[torch.nn.Module]  # a ConvTranspose1d (`.conv`) trimmed both sides
    convnext: type[torch.nn.Module]  # causal depthwise conv, then a pointwise residual MLP
    residual_unit: type[torch.nn.Module]  # snake, dilated causal conv, snake, 1x1 conv, residual
    snake: type[torch.nn.Module]  # the SnakeBeta activation (pointwise)


class TransformersInternalsError(RuntimeError):
    """transformers lacks (or changed) something omnivox relies on: an upgrade moved it, and
    pipeline/families/kit/transformers_internals.py needs to follow."""


REACH = LibraryReach("transformers", WRITTEN_FOR,
                     "pipeline/families/kit/transformers_internals.py",
                     TransformersInternalsError, logger)
_missing = REACH.missing


def _attribute(owner: object, shown: str, name: str, why: str) -> Any:
    """`owner.name`, callable; TransformersInternalsError naming `shown.name` otherwise."""
    return REACH.attribute(owner, shown, name, why, call=True)


@functools.cache
def omni_modeling() -> ModuleType:
    """transformers' Qwen2.5-Omni modeling module."""
    REACH.note_version()
    try:
        return importlib.import_module(OMNI_MODELING)
    except ImportError as exc:
        raise _missing(f"module {OMNI_MODELING}",
                       "Qwen2.5-Omni's audio encoder and ODE solver") from exc


def audio_encoder_class() -> type[torch.nn.Module]:
    """Qwen2.5-Omni's audio encoder (the thinker's audio tower) as a model class of its own."""
    found: type[torch.nn.Module] = _attribute(omni_modeling(), OMNI_MODELING, AUDIO_ENCODER,
                                              "the thinker's audio tower, run alone")
    return found


def ode_solver_class() -> type:
    """The reference's RK4 solver for token2wav's flow matching: `Solver(function=,
    initial_value=).integrate(times)`."""
    found: type = _attribute(omni_modeling(), OMNI_MODELING, ODE_SOLVER,
                             "the reference's ODE solver for token2wav")
    _attribute(found, ODE_SOLVER, "integrate", "the reference's ODE solver for token2wav")
    return found


def model_from_config(model_class: type[Any], config: Any, **kwargs: Any) -> Any:
    """`model_class` built from `config` (its weights uninitialised for a state dict to be
    loaded into), with `PreTrainedModel._from_config`'s keyword arguments (`dtype`)."""
    build = _attribute(model_class, model_class.__name__, _FROM_CONFIG,
                       "a model built from a sub-configuration in a dtype")
    return build(config, **kwargs)


def feature_lengths(encoder: torch.nn.Module, frames: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each utterance's frames after the audio encoder's convolutions, and its rows after
    the encoder's pooling, from its mel frames."""
    lengths = _attribute(encoder, type(encoder).__name__, _FEATURE_LENGTHS,
                         "the audio encoder's frame counts after its convolutions and pooling")
    after_cnn, rows = lengths(frames)
    return after_cnn, rows


@contextmanager
def block_diff_replaced(dit: torch.nn.Module, replace: Callable[[BlockDiff], BlockDiff]
                        ) -> Iterator[None]:
    """Within the block, `dit`'s forward builds its attention masks from `replace(plain)`
    instead of its own block distances `plain` (this instance only; restored on exit)."""
    plain: BlockDiff = _attribute(dit, DIT, _BLOCK_DIFF,
                                  "the DiT's block distances, replaced to mask padded frames")
    setattr(dit, _BLOCK_DIFF, replace(plain))  # the instance attribute shadows the method
    try:
        yield
    finally:
        delattr(dit, _BLOCK_DIFF)


@functools.cache
def qwen3_omni_modeling() -> ModuleType:
    """transformers' Qwen3-Omni modeling module."""
    REACH.note_version()
    try:
        return importlib.import_module(QWEN3_OMNI_MODELING)
    except ImportError as exc:
        raise _missing(f"module {QWEN3_OMNI_MODELING}",
                       "Qwen3-Omni code2wav's layers and audio encoder") from exc


def code2wav_parts() -> Code2WavParts:
    """The classes of Qwen3-Omni code2wav's convolutional layers, to stream them."""
    why = "Qwen3-Omni code2wav's layers, told apart to stream them"
    names = {"causal_conv": "Qwen3OmniMoeCausalConvNet",
             "transposed_conv": "Qwen3OmniMoeCausalTransConvNet",
             "convnext": "Qwen3OmniMoeConvNeXtBlock",
             "residual_unit": "Qwen3OmniMoeCode2WavDecoderResidualUnit",
             "snake": "Qwen3OmniMoeSnakeBeta"}
    module = qwen3_omni_modeling()
    return Code2WavParts(**{field: _attribute(module, QWEN3_OMNI_MODELING, name, why)
                            for field, name in names.items()})


def qwen3_audio_encoder_class() -> type[torch.nn.Module]:
    """Qwen3-Omni's audio encoder (the thinker's audio tower) as a model class of its own."""
    found: type[torch.nn.Module] = _attribute(
        qwen3_omni_modeling(), QWEN3_OMNI_MODELING, "Qwen3OmniMoeAudioEncoder",
        "Qwen3-Omni's audio tower, run alone")
    return found


def attention_implementation(config: object) -> str:
    """The attention kernel a built model's configuration dispatches on ("sdpa", "eager")."""
    found: str = REACH.attribute(config, type(config).__name__, "_attn_implementation",
                                 "the attention kernel a model's layers dispatch on")
    return found
