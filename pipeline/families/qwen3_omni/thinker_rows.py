"""The rows Qwen3-Omni's Talker reads, made in the Thinker worker beside vLLM: thinker rows
projected to the talker's width with the release's `talker.text_projection` and
`talker.hidden_projection`, as transformers 5.19's `Qwen3OmniMoeForConditionalGeneration.
generate` makes them (`_get_talker_user_parts` and the user mask before it, the first three
rows of `_get_talker_assistant_parts`, the reply's rows):

- the prompt part, U + 3 rows: every row of every user turn of the prompt (a row whose most
  recent <|im_start|> is followed by the `user` token), in order, each the hidden projection
  of the thinker's state after its first `accept_hidden_layer` layers (the reference's
  `hidden_states[accept_hidden_layer]`) at an audio row and the text projection of the
  thinker's input embedding elsewhere; then the text projection of the input embeddings of the
  final assistant header's three rows (<|im_start|>, assistant, \\n);
- a reply row: the text projection of a reply token's input embedding.

vLLM hands over no intermediate states (docs/decisions/talker-rows-from-vllm.md), so the
layer-k states at the audio rows come from a torch copy of the thinker's first
`accept_hidden_layer` layers (`Qwen3MoeModel` of the thinker LM directory cut to those layers,
its final norm left out unless the cut keeps every layer, as transformers' last hidden state is
normed): the prompt up to its last audio row, once, only when a user turn holds audio; only
those layers' tensors are read (`first_layers`). MEMORY: at the real size that copy is 24 of
the thinker's 48 layers (a layer: 128 experts of 3 x 2048 x 768, attention of 32 query and 4
key/value heads of 128, the router: 623 M parameters) and the 152064 x 2048 embedding table,
15.3 B parameters, 28.4 GiB in bfloat16, beside vLLM's whole thinker: place it with
`states_device`/`states_dtype`. The text rows need only the embedding table and the two
projections (Linear, activation, Linear: 2048 to 2048 to 1024 published, 6 M parameters each).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import Qwen3MoeModel, Qwen3OmniMoeConfig
from transformers.activations import ACT2FN

from pipeline.families.kit.batched_work import BatchedWork
from pipeline.families.kit.release_tensors import release_tensors
from pipeline.families.kit.torch_placement import Placement
from pipeline.families.kit.work_thread import WorkThread

if TYPE_CHECKING:  # (a type only: `omnivox bench gpu-torch` loads this without the server)
    from pipeline.families.kit.audio_prompt import ThinkerPrompt

MAX_BATCH = 64  # requests' reply rows projected in one call at most
HEADER_ROWS = 3  # <|im_start|>, assistant, \n


class Projection(torch.nn.Module):
    """One of the talker's projections of thinker rows to its width: Linear, activation,
    Linear (transformers' `Qwen3OmniMoeTalkerResizeMLP`, its tensor names)."""

    def __init__(self, tensors: dict[str, torch.Tensor], act: Callable[..., torch.Tensor]):
        super().__init__()
        hidden, width = tensors["linear_fc1.weight"].shape
        out = tensors["linear_fc2.weight"].shape[0]
        self.linear_fc1 = torch.nn.Linear(width, hidden)
        self.linear_fc2 = torch.nn.Linear(hidden, out)
        self.load_state_dict(tensors)
        self.act_fn = act

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        projected: torch.Tensor = self.linear_fc2(self.act_fn(self.linear_fc1(rows)))
        return projected


@dataclass(frozen=True)
class RoleIds:
    """The ids that mark the turns in a prompt."""

    im_start: int
    user: int
    assistant: int


class TalkerInputs:
    """The thinker's first `accept_hidden_layer` layers, its embedding table and the talker's
    projections: a request's prompt part and reply rows."""

    def __init__(self, states: Qwen3MoeModel, text_projection: Projection,
                 hidden_projection: Projection, roles: RoleIds) -> None:
        self.states = states
        self.text_projection = text_projection
        self.hidden_projection = hidden_projection
        self.roles = roles

    @classmethod
    def load(cls, release: Path, thinker_lm: Path,
             placement: Placement | None = None) -> TalkerInputs:
        """The parts from the release (the projections, the configuration) and the thinker LM
        directory (its layers and embedding table), placed (default: CPU, float32)."""
        placement = placement or Placement(torch.device("cpu"), torch.float32)
        config = Qwen3OmniMoeConfig.from_pretrained(release)
        talker: Any = config.talker_config  # a sub-config
        layers = int(talker.accept_hidden_layer)
        states = first_layers(thinker_lm, layers, placement.dtype)
        thinker: Any = config.thinker_config
        if layers < thinker.text_config.num_hidden_layers:  # a middle layer's state: un-normed
            states.norm = torch.nn.Identity()  # type: ignore[assignment]  # no weights to load
        act = ACT2FN[talker.text_config.hidden_act]
        text, hidden = (Projection(release_tensors(release, f"talker.{name}."), act)
                        for name in ("text_projection", "hidden_projection"))
        for part in (states, text, hidden):
            part.eval()
            torch.nn.Module.to(part, placement.device, placement.dtype)  # in place
        roles = RoleIds(int(config.im_start_token_id), int(config.user_token_id),
                        int(config.assistant_token_id))
        return cls(states, text, hidden, roles)

    @property
    def embed_table(self) -> torch.Tensor:
        """(vocab, thinker hidden) input embeddings."""
        weight: torch.Tensor = self.states.embed_tokens.weight
        return weight.detach()

    @torch.inference_mode()
    def prompt_part(self, prompt: ThinkerPrompt) -> torch.Tensor:
        """(U + 3, talker hidden) float32 CPU rows: the user turns' rows, then the assistant
        header's (the module's docstring)."""
        ids = torch.tensor(prompt.ids)
        users = user_rows(ids, self.roles)
        audio = prompt.audio_rows.cpu() & users
        embeds = prompt.embeds.to(self.embed_table)
        device = embeds.device  # the masks are made on the CPU, the rows live here
        rows = self.text_projection(embeds[users.to(device)])
        if audio.any():
            last = int(audio.nonzero().max())  # the states of later rows are not needed
            states = self.layer_states(embeds[:last + 1])
            rows[audio[users].to(device)] = self.hidden_projection(
                states[audio[:last + 1].to(device)])
        start = header_start(ids, self.roles)
        header = self.text_projection(embeds[start:start + HEADER_ROWS])
        return torch.cat([rows, header]).float().cpu()

    def layer_states(self, embeds: torch.Tensor) -> torch.Tensor:
        """The thinker's states after its first `accept_hidden_layer` layers over these
        prompt rows (positions from 0)."""
        positions = torch.arange(len(embeds), device=embeds.device)[None]
        hidden: torch.Tensor = self.states(inputs_embeds=embeds[None], position_ids=positions,
                                           use_cache=False).last_hidden_state[0]
        return hidden

    @torch.inference_mode()
    def reply_rows_many(self, replies: list[list[int]]) -> list[torch.Tensor]:
        """Each reply step's (len(tokens), talker hidden) float32 CPU rows, in one pass."""
        table = self.embed_table
        ids = torch.tensor([t for tokens in replies for t in tokens], device=table.device)
        rows = self.text_projection(table[ids]).float().cpu()
        return list(rows.split([len(tokens) for tokens in replies]))


def first_layers(directory: Path, layers: int, dtype: torch.dtype) -> Qwen3MoeModel:
    """The LM of `directory` (a Qwen3-MoE causal LM) cut to its first `layers` layers: only
    their tensors and the embedding table and final norm are read (transformers reads no
    checkpoint tensor its model lacks); a clear error for anything else missing or left."""
    # transformers' load report would call the layers left unread unexpected: quiet for the
    # load, its findings checked here instead
    quiet = logging.getLogger("transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        loaded: Any = Qwen3MoeModel.from_pretrained(  # (model, info) with output_loading_info
            directory, num_hidden_layers=layers, dtype=dtype, output_loading_info=True)
    finally:
        quiet.setLevel(level)
    model, info = loaded
    left = sorted(key for key in info["unexpected_keys"] if not _after(key, layers))
    wrong = {"missing": sorted(info["missing_keys"]), "mismatched": info["mismatched_keys"],
             "unexpected": left}
    if any(wrong.values()):
        raise ValueError(f"{directory}'s first {layers} layers do not load whole: {wrong}")
    cut: Qwen3MoeModel = model
    return cut


def _after(key: str, layers: int) -> bool:
    """Whether a checkpoint tensor is the LM head's or a layer's from `layers` on."""
    layer = re.match(r"(?:model\.)?layers\.(\d+)\.", key)
    return key.startswith("lm_head.") or (layer is not None and int(layer[1]) >= layers)


def user_rows(ids: torch.Tensor, roles: RoleIds) -> torch.Tensor:
    """(len(ids),) bool: the rows of user turns, as the reference's generate() finds them
    (each row's most recent <|im_start|>, the first row's if none precedes it, is followed by
    the `user` token)."""
    positions = torch.arange(len(ids))
    starts = torch.where(ids == roles.im_start, positions, -1)
    latest = torch.cummax(starts, dim=0).values.clamp_min(0)
    found: torch.Tensor = ids[(latest + 1).clamp_max(len(ids) - 1)] == roles.user
    return found


def header_start(ids: torch.Tensor, roles: RoleIds) -> int:
    """Where the final assistant header (<|im_start|> then `assistant`) starts; a clear error
    for a prompt without one."""
    found = ((ids[:-1] == roles.im_start) & (ids[1:] == roles.assistant)).nonzero()
    if not len(found):
        raise ValueError("the prompt opens no assistant turn: no rows for the Talker")
    return int(found.max())


class ReplyRows:
    """One request's rows for the Talker (a `kit.audio_thinker.TalkerRowSource`): the prompt
    part with the first tokens' rows, then each delta's rows."""

    def __init__(self, thread: WorkThread, inputs: TalkerInputs,
                 replies: BatchedWork[list[int], torch.Tensor], prompt: ThinkerPrompt) -> None:
        # The prompt part is computed while vLLM prefills the same prompt.
        self.opened = asyncio.ensure_future(thread.run(inputs.prompt_part, prompt))
        self.replies = replies
        self.prompt_sent = False

    async def next(self, token_ids: list[int]) -> tuple[int, torch.Tensor]:
        rows = await self.replies.run(token_ids)
        if self.prompt_sent:
            return 0, rows
        part = await self.opened
        self.prompt_sent = True
        return len(part), torch.cat([part, rows])

    def close(self) -> None:
        """Drop the prompt part's computation if nobody waited for it."""
        if not self.opened.done():
            self.opened.cancel()


def batched_replies(thread: WorkThread, inputs: TalkerInputs
                    ) -> BatchedWork[list[int], torch.Tensor]:
    """Concurrent requests' reply rows, projected together as they queue up."""
    return BatchedWork(thread, inputs.reply_rows_many, MAX_BATCH)
