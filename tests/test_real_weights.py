"""The profiles that serve real weights (`omni`, `orpheus`) read a checkpoint directory given
by --model-path, and `omnivox serve` refuses in one line (exit 2), before starting anything,
when it is not given, absent, of the wrong architecture or incomplete; the profiles that build
their own weights refuse one. (Served end to end from a checkpoint directory:
test_architecture_calls.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.cli import main


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
    return root


@pytest.mark.parametrize(("profile", "expected"), [
    ("omni", "profile 'omni' serves real weights: give their directory with --model-path"),
    ("orpheus", "profile 'orpheus' serves real weights"),
])
def test_a_real_profile_needs_a_model_path(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           profile: str, expected: str) -> None:
    assert expected in serve(capsys, tmp_path, "--profile", profile)


def test_a_profile_that_builds_its_weights_refuses_a_model_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    err = serve(capsys, tmp_path, "--profile", "tiny", "--model-path", str(tmp_path))
    assert "profile 'tiny' builds its own weights" in err and "(omni, orpheus)" in err


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


def test_orpheus_refuses_a_directory_without_its_two_parts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    assert "lacks talker/config.json" in serve(capsys, tmp_path, "--profile", "orpheus",
                                               "--model-path", str(bare))
    small = orpheus_layout(tmp_path / "small", vocab=128256)
    assert "is not an Orpheus talker" in serve(capsys, tmp_path, "--profile", "orpheus",
                                               "--model-path", str(small))
    other_rate = orpheus_layout(tmp_path / "rate", rate=32000)
    assert "is not SNAC 24 kHz" in serve(capsys, tmp_path, "--profile", "orpheus",
                                         "--model-path", str(other_rate))
