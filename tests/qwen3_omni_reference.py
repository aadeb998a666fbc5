"""transformers' Qwen3-Omni talker as the reference of our Talker, on the tiny release: what
test_qwen3_omni_talker_frames.py (frame by frame) and test_qwen3_omni_talker.py (the stage)
share.

The release is the family's tiny one with its thinker embedding redrawn at std EMBEDDING_STD
(`write_reference_release`). The reference is transformers 5.19's own generate():
`Qwen3OmniMoeForConditionalGeneration` runs its thinker on a text prompt (greedy, stopped at
a token of its reply chosen as the stop token), builds the talker's inputs
(`_get_talker_user_parts`, `_get_talker_assistant_parts`, the trailing text rows) and runs
`talker.generate` greedy (do_sample False, so its code predictor is greedy too) for a number of
frames, every codec special but eos suppressed as `suppressed_ids` says. Its inputs, states and
codes are recorded (`reference`). Our side gets the Thinker's rows as the lead's contract has
them (`text_rows`: text_projection of the thinker's embeddings: the prompt part, then one row
per reply token, the stop token included). Both test modules take the release and the model as
module fixtures (`release_fixture`, `omni_fixture`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3OmniMoeForConditionalGeneration

from pipeline.families.qwen3_omni.build import SEED
from pipeline.families.qwen3_omni.release import write_tiny_release
from pipeline.families.qwen3_omni.talker_frames import suppressed_ids
from pipeline.families.qwen3_omni.tiny_config import CODEBOOK_SIZE, TokenIds

VOICE = "Ethan"
NEWLINE = 198  # an ordinary text id standing for "\n"
USER_TEXT = [11, 22, 33, 44, 55]
REPLY_MAX = 10  # thinker tokens at most
STOP_AT = 5  # the reply's token at this index (or the next new one) is made its stop token
THINKER_EMBEDDING = "thinker.model.embed_tokens.weight"
EMBEDDING_STD = 1.0


def write_reference_release(directory: Path) -> Path:
    """The family's tiny release in `directory`, its thinker embedding redrawn at std
    EMBEDDING_STD; the directory.

    At transformers' std of 0.02 the embeddings vanish under text_projection's perturbed
    biases: every projected text row (reply tokens, tts_bos / eos / pad) is the same row
    within 3e-3 at a norm of 1.2, and feeding the wrong one moves no code. At std 1 which
    text row is fed shows in the frames. Only the thinker's tensors change: the talker's LM,
    code predictor and codec head are the family's."""
    write_tiny_release(directory, SEED)
    weights = directory / "model.safetensors"
    tensors = load_file(weights)
    table = tensors[THINKER_EMBEDDING]
    tensors[THINKER_EMBEDDING] = EMBEDDING_STD * torch.randn(
        table.shape, generator=torch.Generator().manual_seed(SEED), dtype=table.dtype)
    save_file(tensors, weights, metadata={"format": "pt"})
    return directory


def load_omni(release: Path) -> Qwen3OmniMoeForConditionalGeneration:
    """transformers' Qwen3-Omni from the release, float32, in eval mode."""
    model: Qwen3OmniMoeForConditionalGeneration = (
        Qwen3OmniMoeForConditionalGeneration.from_pretrained(release, dtype=torch.float32).eval())
    return model


def release_fixture() -> Callable[..., Any]:
    """A module-scoped fixture: the reference's release (`write_reference_release`) in a new
    directory, torch set to one thread for the module."""

    @pytest.fixture(scope="module")
    def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
        torch.set_num_threads(1)
        return write_reference_release(tmp_path_factory.mktemp("release"))

    return release


def omni_fixture() -> Callable[..., Any]:
    """A module-scoped fixture: transformers' Qwen3-Omni from the module's `release`."""

    @pytest.fixture(scope="module")
    def omni(release: Path) -> Qwen3OmniMoeForConditionalGeneration:
        return load_omni(release)

    return omni


def prompt_ids() -> list[int]:
    """A user turn then the assistant header: the Thinker's prompt part (U + 3 rows)."""
    ids = TokenIds()
    return [ids.im_start, ids.user, NEWLINE, *USER_TEXT, ids.im_end, NEWLINE,
            ids.im_start, ids.assistant, NEWLINE]


@dataclass(frozen=True)
class Reference:
    """transformers' talker on one prompt: its thinker reply (stop token last), the rows its
    talker read (prefill, then one per step), its states h_k and its frames' codes."""

    reply: list[int]
    prefill: torch.Tensor
    steps: torch.Tensor  # (steps, hidden)
    states: torch.Tensor  # (frames, hidden): h_k read by frame k + 1's code predictor
    codes: list[list[int]]


def stop_token(omni: Qwen3OmniMoeForConditionalGeneration) -> int:
    """A token of the greedy reply at STOP_AT or after, none like it before (where the thinker
    stops when it is the eos)."""
    prompt = torch.tensor([prompt_ids()])
    with torch.inference_mode():
        out: Any = omni.thinker.generate(input_ids=prompt, max_new_tokens=REPLY_MAX,
                                         do_sample=False, eos_token_id=TokenIds().im_end)
    reply: list[int] = out[0, prompt.shape[1]:].tolist()
    return next(t for i, t in enumerate(reply) if i >= STOP_AT and t not in reply[:i])


def generate_reference(omni: Qwen3OmniMoeForConditionalGeneration, penalty: float, frames: int,
              voice: str = VOICE) -> Reference:
    """The reference generate()'s greedy talker for `frames` frames at this repetition
    penalty (callers filter transformers' warning that the penalty skips the prompt: the
    reference's generate() wants that)."""
    talker: Any = omni.talker
    steps: list[torch.Tensor] = []
    results: list[Any] = []
    original = talker.generate

    def generate(**kwargs: Any) -> Any:
        results.append(original(**kwargs))
        return results[-1]

    def record(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        steps.append(kwargs["inputs_embeds"][0].clone())

    config: Any = omni.config.talker_config
    suppressed = suppressed_ids(config.text_config.vocab_size, CODEBOOK_SIZE,
                                config.codec_eos_token_id)
    stop = stop_token(omni)
    hook = talker.model.register_forward_pre_hook(record, with_kwargs=True)
    talker.generate = generate
    try:
        with torch.inference_mode():
            sequences, _ = omni.generate(
                input_ids=torch.tensor([prompt_ids()]), speaker=voice,
                thinker_max_new_tokens=REPLY_MAX, thinker_eos_token_id=stop,
                talker_do_sample=False, talker_repetition_penalty=penalty,
                talker_max_new_tokens=frames + 1, talker_suppress_tokens=suppressed)
    finally:
        hook.remove()
        del talker.generate
    out = results[0]
    codes = [h[-1][0].tolist() for h in out.hidden_states if h[-1] is not None]
    states = torch.stack([h[0][-1][0, -1] for h in out.hidden_states[:len(codes)]])
    reply = sequences[0, len(prompt_ids()):].tolist()
    assert reply[-1] == stop, "the thinker stopped at the stop token"
    return Reference(reply, steps[0], torch.cat(steps[1:]), states, codes)


def text_rows(omni: Qwen3OmniMoeForConditionalGeneration, ids: list[int]) -> torch.Tensor:
    """The Thinker's rows for these text tokens: text_projection of their embeddings."""
    with torch.inference_mode():
        embedded = omni.thinker.get_input_embeddings()(torch.tensor(ids))
        rows: torch.Tensor = omni.talker.text_projection(embedded)
    return rows


def turn_rows(omni: Qwen3OmniMoeForConditionalGeneration,
              seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A prompt part and a reply's rows (its stop token's last) of random text, lengths
    varying with the seed."""
    generator = torch.Generator().manual_seed(seed)
    ids = TokenIds()
    user = torch.randint(0, ids.user, (3 + seed % 5,), generator=generator).tolist()
    reply = torch.randint(0, ids.user, (4 + seed % 3,), generator=generator).tolist()
    prompt = [ids.im_start, ids.user, NEWLINE, *user, ids.im_end, NEWLINE,
              ids.im_start, ids.assistant, NEWLINE]
    return text_rows(omni, prompt), text_rows(omni, [*reply, ids.im_end])
