"""The tiny Talker's prompt: [speaker, projected Thinker text embeddings, audio context].

talker_extra/ holds the Thinker-to-Talker projection and the speaker table; the
audio context is embedded with the Talker LLM's own token embedding table, so the prompt is
exactly what the Talker would see had it produced those speech tokens itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from pipeline.families.tiny.qwen2 import INIT_STD, load_embedding_table
from pipeline.families.voices import FAMILY_VOICES

# A directory of its own: vLLM loads every *.safetensors beside the LLM's config.json.
EXTRA_DIR = "talker_extra"
VOICES = FAMILY_VOICES["tiny"]
N_CODES = 256  # speech codes are token ids 0..255; specials follow
BOS, EOS, PAD, SEP = N_CODES, N_CODES + 1, N_CODES + 2, N_CODES + 3
VOCAB_SIZE = N_CODES + 4


def write_talker_extra(directory: Path, thinker_hidden: int, talker_hidden: int,
                       seed: int) -> None:
    """Write the random projection and speaker table, and their config, under EXTRA_DIR."""
    directory = directory / EXTRA_DIR
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    # Scaled so a projected embedding keeps the norm of its input (both ~INIT_STD per dim).
    scale = (1.0 / thinker_hidden) ** 0.5
    tensors = {
        "projection.weight": torch.randn(talker_hidden, thinker_hidden, generator=generator)
        * scale,
        "projection.bias": torch.zeros(talker_hidden),
        "speakers.weight": torch.randn(len(VOICES), talker_hidden, generator=generator)
        * INIT_STD,
    }
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = {"voices": list(VOICES), "n_codes": N_CODES, "thinker_hidden": thinker_hidden,
              "talker_hidden": talker_hidden, "bos": BOS, "eos": EOS, "pad": PAD, "sep": SEP}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")


class TalkerPromptBuilder:
    """Builds the Talker's prompt embeddings for one chunk of Thinker text."""

    def __init__(self, directory: Path) -> None:
        self.config = json.loads((directory / EXTRA_DIR / "config.json").read_text())
        extra = load_file(str(directory / EXTRA_DIR / "model.safetensors"))
        self.projection_w = extra["projection.weight"]
        self.projection_b = extra["projection.bias"]
        self.speakers = extra["speakers.weight"]
        self.voices: list[str] = self.config["voices"]
        self.n_codes: int = self.config["n_codes"]
        self.embed_table = load_embedding_table(directory)

    def speaker(self, voice: str) -> torch.Tensor:
        """The (1, talker_hidden) embedding of `voice`; unknown voices are a clear error."""
        if voice not in self.voices:
            raise ValueError(f"unknown voice {voice!r}; this family has {self.voices}")
        return self.speakers[self.voices.index(voice)].unsqueeze(0)

    @torch.inference_mode()
    def build(self, text_embeds: torch.Tensor, context: list[int], voice: str,
              max_context: int) -> torch.Tensor:
        """(1 + n_text + n_context, talker_hidden) prompt; context capped to its last tokens."""
        projected = text_embeds.float() @ self.projection_w.T + self.projection_b
        kept = [t for t in context[-max_context:] if 0 <= t < self.n_codes] if max_context else []
        ctx = self.embed_table[torch.tensor(kept, dtype=torch.long)] if kept else None
        parts = [self.speaker(voice), projected] + ([ctx] if ctx is not None else [])
        return torch.cat(parts, dim=0)
