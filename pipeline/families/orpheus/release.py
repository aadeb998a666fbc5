"""A real Orpheus checkpoint as the `orpheus` profile serves it: one directory holding talker/
(an Orpheus release, e.g. canopylabs/orpheus-3b-0.1-ft), snac/ (hubertsiuzdak/snac_24khz) and
thinker/ (a Qwen2.5-Omni release, which hears the caller itself, or any vLLM chat model
directory, the caller then heard by the recognizer; a symlink to one is fine), read where it
lies; checked before any engine loads it."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.families import load_family
from pipeline.families.orpheus.codes import AUDIO_IDS

TALKER = "talker"
SNAC = "snac"
THINKER = "thinker"
SNAC_RATE = 24_000
LAYOUT = ("it holds talker/ (an Orpheus release, e.g. canopylabs/orpheus-3b-0.1-ft), snac/ "
          "(hubertsiuzdak/snac_24khz) and thinker/ (a Qwen2.5-Omni release or any vLLM chat "
          "model directory; a symlink to one is fine)")
# A Qwen2.5-Omni release: its thinker hears the caller's audio. Also the name of the family
# that serves it, found through the families registry (a family imports no other).
OMNI_THINKER = "qwen25_omni"
CHAT_THINKER = "chat"  # a text chat model: the recognizer hears the caller first
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def check_release(directory: Path) -> None:
    """Nothing, if `directory` holds both parts; else an error naming what is absent or
    wrong."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no Orpheus checkpoint at {directory}: the directory is "
                                f"absent ({LAYOUT})")
    for part in (TALKER, SNAC, THINKER):
        if not (directory / part / "config.json").is_file():
            raise FileNotFoundError(f"the Orpheus checkpoint at {directory} lacks "
                                    f"{part}/config.json ({LAYOUT})")
    check_talker(directory / TALKER)
    rate = json.loads((directory / SNAC / "config.json").read_text()).get("sampling_rate")
    if rate != SNAC_RATE:
        raise ValueError(f"{directory / SNAC} is not SNAC 24 kHz: its config.json has "
                         f"sampling_rate {rate!r}")
    thinker_kind(directory / THINKER)


def thinker_kind(directory: Path) -> str:
    """OMNI_THINKER or CHAT_THINKER: what `directory` (with a config.json) serves as the
    Thinker; a clear error naming what a Qwen2.5-Omni release or a chat model lacks."""
    config = json.loads((directory / "config.json").read_text())
    omni = load_family(OMNI_THINKER)
    if config.get("model_type") == omni.CHECKPOINT_MODEL_TYPE:
        omni.check_checkpoint(directory)
        return OMNI_THINKER
    missing = [what for what, found in (
        ("its architectures in config.json", bool(config.get("architectures"))),
        ("weights (*.safetensors or *.bin)", any(directory.glob("*.safetensors"))
         or any(directory.glob("*.bin"))),
        ("tokenizer_config.json", (directory / "tokenizer_config.json").is_file()),
        ("a chat template", _has_chat_template(directory))) if not found]
    if missing:
        raise ValueError(f"the Thinker at {directory} is neither a Qwen2.5-Omni release nor a "
                         f"vLLM chat model directory: it lacks {', '.join(missing)}")
    return CHAT_THINKER


def _has_chat_template(directory: Path) -> bool:
    """Whether the tokenizer renders chats: a template in tokenizer_config.json or its own file."""
    if any((directory / name).is_file() for name in CHAT_TEMPLATE_FILES):
        return True
    tokenizer_config = directory / "tokenizer_config.json"
    return tokenizer_config.is_file() and bool(
        json.loads(tokenizer_config.read_text()).get("chat_template"))


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
