"""What the local family's stages share: where the built models are (a clear error if absent)."""

from __future__ import annotations

from pathlib import Path

from pipeline.families.kit.build_support import MANIFEST
from pipeline.families.kit.packaged import VOICE_NAME
from pipeline.families.local.build import FAMILY, VOICE_DIR
from pipeline.stage import StageContext


def family_dir(ctx: StageContext) -> Path:
    """The built family directory; a clear error when it has not been built."""
    directory = Path(ctx.models_dir) / FAMILY
    if not (directory / MANIFEST).is_file():
        raise FileNotFoundError(
            f"local family not built at {directory}: run "
            f"pipeline.families.local.build_local({ctx.models_dir!r}) (or `omnivox models "
            f"build local`) first")
    return directory


def voice_files(ctx: StageContext) -> tuple[Path, Path]:
    """The built Piper voice: (ONNX model, its JSON config)."""
    directory = family_dir(ctx) / VOICE_DIR
    return directory / f"{VOICE_NAME}.onnx", directory / f"{VOICE_NAME}.onnx.json"
