"""The profiles that serve real weights (`omni`, `orpheus`, `qwen3-omni`) read a checkpoint
directory given by --model-path, and `omnivox serve` refuses in one line (exit 2), before
starting anything, when it is not given, absent, of the wrong architecture or incomplete; the
profiles that build their own weights refuse one; the orpheus checkpoint's thinker/ must be a
Qwen2.5-Omni release or a vLLM chat model directory. (Served end to end from a checkpoint
directory: test_architecture_calls.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agent.cli import main
from pipeline.families.orpheus.release import CHAT_THINKER, thinker_kind


def serve(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> str:
    """`omnivox serve ...`'s refusal: exit 2 and one line on stderr (returned)."""
    code = main(["serve", "--models-dir", str(tmp_path / "models"), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("omnivox: "), err
    return err


def write_config(directory: Path, **config: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def orpheus_layout(root: Path, vocab: int = 156940, rate: int = 24000) -> Path:
    write_config(root / "talker", architectures=["LlamaForCausalLM"], vocab_size=vocab)
    write_config(root / "snac", sampling_rate=rate)
    write_config(root / "thinker", architectures=["LlamaForCausalLM"])
    return root


@pytest.mark.parametrize(("profile", "expected"), [
    ("omni", "profile 'omni' serves real weights: give their directory with --model-path"),
    ("orpheus", "profile 'orpheus' serves real weights"),
    ("qwen3-omni", "profile 'qwen3-omni' serves real weights"),
])
def test_a_real_profile_needs_a_model_path(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           profile: str, expected: str) -> None:
    assert expected in serve(capsys, tmp_path, "--profile", profile)


def test_a_profile_that_builds_its_weights_refuses_a_model_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    err = serve(capsys, tmp_path, "--profile", "tiny", "--model-path", str(tmp_path))
    assert "profile 'tiny' builds its own weights" in err
    assert "(omni, orpheus, qwen3-omni, qwen3-omni-80gb)" in err


def test_omni_refuses_a_directory_that_is_not_a_whole_release(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    absent = tmp_path / "nowhere"
    assert f"no Qwen2.5-Omni release at {absent}" in serve(
        capsys, tmp_path, "--profile", "omni", "--model-path", str(absent))
    llama = write_config(tmp_path / "llama", model_type="llama",
                         architectures=["LlamaForCausalLM"])
    assert "model_type 'llama'" in serve(capsys, tmp_path, "--profile", "omni",
                                         "--model-path", str(llama))
    omni = write_config(tmp_path / "omni", model_type="qwen2_5_omni",
                        architectures=["Qwen2_5OmniForConditionalGeneration"])
    err = serve(capsys, tmp_path, "--profile", "omni", "--model-path", str(omni))
    assert "lacks model.safetensors, vocab.json, tokenizer_config.json" in err


def test_qwen3_omni_refuses_a_directory_that_is_not_a_whole_release(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    absent = tmp_path / "nowhere"
    assert f"no Qwen3-Omni release at {absent}" in serve(
        capsys, tmp_path, "--profile", "qwen3-omni", "--model-path", str(absent))
    older = write_config(tmp_path / "omni", model_type="qwen2_5_omni",
                         architectures=["Qwen2_5OmniForConditionalGeneration"])
    assert "model_type 'qwen2_5_omni'" in serve(capsys, tmp_path, "--profile", "qwen3-omni",
                                                "--model-path", str(older))
    bare = write_config(tmp_path / "qwen3", model_type="qwen3_omni_moe",
                        architectures=["Qwen3OmniMoeForConditionalGeneration"])
    err = serve(capsys, tmp_path, "--profile", "qwen3-omni", "--model-path", str(bare))
    assert "lacks model.safetensors, vocab.json, tokenizer_config.json, preprocessor_config.json" \
        in err, err


def test_orpheus_refuses_a_directory_without_its_parts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    assert "lacks talker/config.json" in serve(capsys, tmp_path, "--profile", "orpheus",
                                               "--model-path", str(bare))
    no_thinker = orpheus_layout(tmp_path / "no_thinker")
    shutil.rmtree(no_thinker / "thinker")
    err = serve(capsys, tmp_path, "--profile", "orpheus", "--model-path", str(no_thinker))
    assert "lacks thinker/config.json" in err and "any vLLM chat model directory" in err
    small = orpheus_layout(tmp_path / "small", vocab=128256)
    assert "is not an Orpheus talker" in serve(capsys, tmp_path, "--profile", "orpheus",
                                               "--model-path", str(small))
    other_rate = orpheus_layout(tmp_path / "rate", rate=32000)
    assert "is not SNAC 24 kHz" in serve(capsys, tmp_path, "--profile", "orpheus",
                                         "--model-path", str(other_rate))


def test_orpheus_refuses_a_thinker_that_is_no_chat_model_or_omni_release(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The checkpoint's thinker/ must be a whole Qwen2.5-Omni release or a vLLM chat model
    directory (architecture, weights, tokenizer with a chat template); the refusal names what
    it lacks."""
    checkpoint = orpheus_layout(tmp_path / "checkpoint")
    thinker = checkpoint / "thinker"
    err = serve(capsys, tmp_path, "--profile", "orpheus", "--model-path", str(checkpoint))
    assert (f"the Thinker at {thinker} is neither a Qwen2.5-Omni release nor a vLLM chat model "
            "directory: it lacks weights (*.safetensors or *.bin), tokenizer_config.json, "
            "a chat template") in err
    (thinker / "model.safetensors").touch()
    (thinker / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    err = serve(capsys, tmp_path, "--profile", "orpheus", "--model-path", str(checkpoint))
    assert err.endswith("it lacks a chat template")
    write_config(thinker, model_type="qwen2_5_omni",
                 architectures=["Qwen2_5OmniForConditionalGeneration"])
    err = serve(capsys, tmp_path, "--profile", "orpheus", "--model-path", str(checkpoint))
    assert f"Qwen2.5-Omni release at {thinker} lacks vocab.json" in err


def test_a_chat_model_directory_is_a_thinker(tmp_path: Path) -> None:
    thinker = write_config(tmp_path / "chat", architectures=["Qwen2ForCausalLM"])
    (thinker / "model.safetensors").touch()
    (thinker / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    assert thinker_kind(thinker) == CHAT_THINKER
    (thinker / "tokenizer_config.json").write_text("{}")
    (thinker / "chat_template.jinja").write_text("{{ x }}")
    assert thinker_kind(thinker) == CHAT_THINKER
