"""The qwen3_omni model family: Qwen3-Omni's thinker, talker and code2wav on omnivox (issue 32).

This first increment is torch only: the tiny release (`build`, `tiny_config.py`,
`release.py`) and code2wav rendered as a stream (`code2wav.py`). It has no stages yet, so it
exposes no `STAGES` and the registry (`pipeline.families.load_family`) refuses it by name; the
thinker, talker and VoiceBox stages come in later increments.
"""

from pipeline.families.qwen3_omni.build import build_qwen3_omni
from pipeline.families.qwen3_omni.release import MODEL_TYPE, check_release

build = build_qwen3_omni
check_checkpoint = check_release  # a real release, before serving it
CHECKPOINT_MODEL_TYPE = MODEL_TYPE  # config.json's model_type in the releases it serves

__all__ = ["CHECKPOINT_MODEL_TYPE", "build", "build_qwen3_omni", "check_checkpoint"]
