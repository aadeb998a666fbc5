"""A real Orpheus checkpoint as the `orpheus` profile serves it: one directory holding talker/
(an Orpheus release, e.g. canopylabs/orpheus-3b-0.1-ft) and snac/ (hubertsiuzdak/snac_24khz),
read where it lies; checked before any engine loads it."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.families.orpheus.codes import AUDIO_IDS

TALKER = "talker"
SNAC = "snac"
SNAC_RATE = 24_000
LAYOUT = ("it holds talker/ (an Orpheus release, e.g. canopylabs/orpheus-3b-0.1-ft) and snac/ "
          "(hubertsiuzdak/snac_24khz)")


def check_release(directory: Path) -> None:
    """Nothing, if `directory` holds both parts; else an error naming what is absent or
    wrong."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no Orpheus checkpoint at {directory}: the directory is "
                                f"absent ({LAYOUT})")
    for part in (TALKER, SNAC):
        if not (directory / part / "config.json").is_file():
            raise FileNotFoundError(f"the Orpheus checkpoint at {directory} lacks "
                                    f"{part}/config.json ({LAYOUT})")
    check_talker(directory / TALKER)
    rate = json.loads((directory / SNAC / "config.json").read_text()).get("sampling_rate")
    if rate != SNAC_RATE:
        raise ValueError(f"{directory / SNAC} is not SNAC 24 kHz: its config.json has "
                         f"sampling_rate {rate!r}")


def check_talker(directory: Path) -> Path:
    """`directory`, if its config.json is a Llama with Orpheus's audio ids; else a clear error
    (before an engine loads a model it cannot speak with)."""
    config = json.loads((directory / "config.json").read_text())
    architectures = config.get("architectures") or []
    if "LlamaForCausalLM" not in architectures or config.get("vocab_size", 0) < AUDIO_IDS.stop:
        raise ValueError(
            f"{directory} is not an Orpheus talker: it needs a LlamaForCausalLM with at least "
            f"{AUDIO_IDS.stop} ids (its audio ids), not {architectures} with "
            f"{config.get('vocab_size')}")
    return directory
