"""The talker's language model as a plain `Qwen3MoeForCausalLM` directory, for stock vLLM.

Qwen3-Omni's talker text model (`Qwen3OmniMoeTalkerModel`) is a Qwen3-MoE decoder (RMS norms
on each head's queries and keys, no attention biases, softmax top-k routing renormalised) whose
every layer also adds a shared expert gated by sigmoid(shared_expert_gate(x)), under
interleaved M-RoPE. vLLM 0.32's `Qwen3MoeForCausalLM` builds exactly that shared expert when its
config has `shared_expert_intermediate_size > 0` (model_executor/models/qwen3_moe.py:177-204,
the gate applied in Qwen3MoeMLP.forward:127-128), and the talker's positions are equal in all
three M-RoPE components for audio and text prompts, where interleaved M-RoPE IS 1-D RoPE at the
same theta (as for the thinker, `thinker_lm.py`). So that stock class computes the talker's
text model; the codec head (`talker.codec_head`, codebook 0's logits) is its lm_head and the
codec embedding its input embedding. docs/decisions/qwen3-omni-talker-on-vllm.md says how the
talker is then served (its every step's input embedding comes from outside the LM).

transformers' own `Qwen3MoeForCausalLM` has no shared expert: `torch_talker_lm` loads the same
directory into it with the gated shared expert grafted into each sparse block as vLLM computes
it, a torch copy of what vLLM serves (the parity test's subject; also usable where vLLM is not).

Written: config.json (`lm_config`), the talker's `model.*` tensors with `talker.` dropped,
`codec_embedding` as `embed_tokens` and `codec_head` as `lm_head`
(`release_tensors.write_mapped_shards`, shard by shard, experts one by one as the release
names them), and generation_config.json whose eos is the codec's end of speech. The code
predictor and the two projections stay in the release.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM, Qwen3OmniMoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeMLP, Qwen3MoeSparseMoeBlock

from pipeline.families.kit.build_support import write_json
from pipeline.families.kit.release_tensors import release_tensor_names, write_mapped_shards
from pipeline.families.qwen3_omni import qwen3_moe_lm
from pipeline.families.qwen3_omni.qwen3_moe_lm import GENERATION_CONFIG, check_plain_decoder

_MODEL = "talker.model."
_EMBEDDING = "talker.model.codec_embedding.weight"
_HEAD = "talker.codec_head.weight"
# Not declared by Qwen3MoeConfig; vLLM's Qwen3-MoE reads it with getattr (0: no shared expert)
SHARED_EXPERT_FIELD = "shared_expert_intermediate_size"


def write_talker_lm(release: Path, directory: Path, dummy_weights: bool = False) -> None:
    """Write the talker's LM from the release directory `release` into `directory`.

    `dummy_weights`: the release is weightless (`dummy_weights.py`); so is the LM, mapped from
    the release's headers without reading or writing any data.
    """
    release, directory = Path(release), Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lm_config(release).save_pretrained(directory)
    write_mapped_shards(release, directory, lm_tensor_name, dummy_weights)
    write_json(directory / GENERATION_CONFIG, {"eos_token_id": codec_eos_id(release)})


def lm_tensor_name(name: str) -> str | None:
    """The LM's name of the release tensor `name`; None for every tensor not the talker's
    text model or codec head (thinker, code2wav, code predictor, the two projections)."""
    if name == _EMBEDDING:
        return "model.embed_tokens.weight"
    if name == _HEAD:
        return "lm_head.weight"
    if name.startswith(_MODEL):
        return "model." + name.removeprefix(_MODEL)
    return None


def talker_config(release: Path) -> Any:
    """The release's talker config (a `Qwen3OmniMoeTalkerConfig`)."""
    return Qwen3OmniMoeConfig.from_pretrained(release).talker_config


def text_config(release: Path) -> Any:
    """The talker's text config (a `Qwen3OmniMoeTalkerTextConfig`)."""
    return talker_config(release).text_config


def codec_eos_id(release: Path) -> int:
    """The codec id that ends the talker's speech (the reference generate()'s eos)."""
    return int(talker_config(release).codec_eos_token_id)


def lm_config(release: Path) -> Qwen3MoeConfig:
    """The Qwen3-MoE config of the release's talker text model (`qwen3_moe_lm.lm_config`)
    with its gated shared expert; every layer sparse (the reference's talker layers all are,
    whatever decoder_sparse_step and mlp_only_layers say); the codec's end as eos; the lm_head
    tied to the embedding only where the release has no codec head of its own. A clear error
    for a talker no Qwen3-MoE decoder computes (`_check_convertible`)."""
    text = text_config(release)
    _check_convertible(text)
    shared_expert: dict[str, Any] = {SHARED_EXPERT_FIELD: int(text.shared_expert_intermediate_size)}
    return qwen3_moe_lm.lm_config(
        release, text, decoder_sparse_step=1, mlp_only_layers=[],
        tie_word_embeddings=_HEAD not in release_tensor_names(release),
        bos_token_id=None, eos_token_id=codec_eos_id(release), pad_token_id=None,
        **shared_expert)


def _check_convertible(text: Any) -> None:
    """Refuse a talker text model that the plain Qwen3-MoE decoder would compute differently:
    an activation other than SiLU (vLLM's Qwen3-MoE MLP supports no other), no experts, or
    what `qwen3_moe_lm.check_plain_decoder` refuses in either LM."""
    problems = []
    if text.hidden_act != "silu":
        problems.append(f"hidden_act is {text.hidden_act!r}")
    if not text.num_experts:
        problems.append("it has no experts")
    check_plain_decoder(text, "talker", problems)


class SharedExpertMoeBlock(Qwen3MoeSparseMoeBlock):
    """transformers' Qwen3-MoE sparse block plus the gated shared expert vLLM's Qwen3-MoE adds
    for `shared_expert_intermediate_size > 0`: routed(x) + sigmoid(gate(x)) * shared(x)."""

    def __init__(self, config: Qwen3MoeConfig) -> None:
        super().__init__(config)
        width = int(getattr(config, SHARED_EXPERT_FIELD))
        self.shared_expert = Qwen3MoeMLP(config, intermediate_size=width)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        routed: torch.Tensor = super().forward(hidden_states)
        gate = torch.sigmoid(self.shared_expert_gate(hidden_states))
        shared: torch.Tensor = self.shared_expert(hidden_states)
        return routed + gate * shared


class SharedExpertQwen3MoeForCausalLM(Qwen3MoeForCausalLM):
    """transformers' Qwen3MoeForCausalLM whose sparse blocks carry the gated shared expert
    (where the config asks for one): the directory as vLLM's Qwen3MoeForCausalLM computes it."""

    def __init__(self, config: Qwen3MoeConfig) -> None:
        super().__init__(config)
        if getattr(config, SHARED_EXPERT_FIELD, 0):
            for layer in self.model.layers:
                if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock):
                    layer.mlp = SharedExpertMoeBlock(config)


def torch_talker_lm(directory: Path, dtype: torch.dtype = torch.float32
                    ) -> SharedExpertQwen3MoeForCausalLM:
    """The converted LM at `directory` in torch (eval mode); a clear error for a tensor the
    directory lacks or one the model does not read."""
    loaded: Any = SharedExpertQwen3MoeForCausalLM.from_pretrained(
        Path(directory), dtype=dtype, output_loading_info=True)  # (model, loading info)
    lm, info = loaded
    unread = {key: sorted(info[key]) for key in ("missing_keys", "unexpected_keys")
              if info[key]}
    if unread:
        raise ValueError(f"{directory} does not load as the talker LM: {unread}")
    model: SharedExpertQwen3MoeForCausalLM = lm.eval()
    return model
