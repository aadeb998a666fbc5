"""`omnivox bench gpu` without a GPU: the real-size configurations give the published parameter
counts (counted on torch's meta device), weightless checkpoints read back as zeros, the dry
run's JSON, and the one-line refusal without CUDA. No engine starts here."""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from snac import SNAC
from transformers import LlamaForCausalLM

from agent.bench.gpu import NO_CUDA, level_list
from agent.bench.gpu_families import gpu_profile
from agent.cli import main
from pipeline.families.kit.dummy_weights import (
    meta_tensors,
    parameter_count,
    write_sparse_safetensors,
)
from pipeline.families.orpheus.real_size import talker_config
from pipeline.families.orpheus.snac_decoder import SNAC_24KHZ
from pipeline.families.qwen3_omni import real_size as qwen3_size
from pipeline.families.qwen3_omni import real_stages as qwen3_stages
from pipeline.families.qwen3_omni.tiny_config import tiny_config as qwen3_tiny_config
from pipeline.families.qwen25_omni.real_size import real_config, release_tensors

LLAMA_32_3B = 3_212_749_824  # Llama-3.2-3B's parameters (128256 ids, tied embedding)


def test_qwen25_omni_thinker_lm_is_qwen25_7b() -> None:
    """The thinker's LM is Qwen2.5-7B: 7.61B parameters with its untied embedding and lm_head,
    6.53B without them (the figures Qwen2.5-7B's model card publishes); the talker is the
    release's 896-wide one (1.35B), not transformers' default (the thinker's widths, 6.6B)."""
    tensors = release_tensors(real_config())
    total = parameter_count(tensors, "thinker.model.") + parameter_count(tensors,
                                                                         "thinker.lm_head.")
    embeddings = (parameter_count(tensors, "thinker.model.embed_tokens.")
                  + parameter_count(tensors, "thinker.lm_head."))
    # within the card's last digit (7.6156B and 6.5256B: it rounds one down, one up)
    assert abs(total / 1e9 - 7.61) < 0.01
    assert abs((total - embeddings) / 1e9 - 6.53) < 0.01
    talker = parameter_count(tensors, "talker.")
    assert 1.3e9 < talker < 1.4e9


def test_orpheus_talker_is_llama_32_3b_with_orpheus_vocabulary() -> None:
    """Orpheus 3B is Llama-3.2-3B whose tied embedding grows from 128256 to 156940 rows:
    exactly 28684 x 3072 more parameters (3.30B)."""
    tensors = meta_tensors(lambda: LlamaForCausalLM(talker_config()))
    tensors.pop("lm_head.weight")  # tied to the embedding
    assert parameter_count(tensors) == LLAMA_32_3B + (156940 - 128256) * 3072


def test_snac_24khz_has_its_published_size() -> None:
    """snac_24khz: 19.8M parameters (the snac package's README)."""
    count = parameter_count(meta_tensors(lambda: SNAC(**SNAC_24KHZ)))
    assert round(count / 1e6, 1) == 19.8


def test_sparse_safetensors_reads_as_zeros(tmp_path: Path) -> None:
    tensors = {"a": torch.empty(3, 5, device="meta"), "b": torch.empty(7, device="meta"),
               "steps": torch.empty(2, dtype=torch.int64, device="meta")}
    size = write_sparse_safetensors(tmp_path / "w.safetensors", tensors)
    loaded = load_file(tmp_path / "w.safetensors")
    assert size == (15 + 7) * 2 + 2 * 8
    assert loaded["a"].shape == (3, 5) and loaded["a"].dtype == torch.bfloat16
    assert loaded["steps"].dtype == torch.int64
    assert all(not t.any() for t in loaded.values())


def test_dry_run_writes_each_stage_size(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    assert main(["bench", "gpu", "--size", "tiny", "--dry-run", "--root", str(tmp_path / "m"),
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["dry_run"] and result["size"] == "tiny"
    assert set(result["families"]) == {"qwen25_omni", "orpheus", "qwen3_omni"}
    assert "cuda_ipc_tests" not in result
    omni, orpheus = result["families"]["qwen25_omni"], result["families"]["orpheus"]
    qwen3 = result["families"]["qwen3_omni"]
    assert set(omni["stages"]) == {"thinker", "talker", "voicebox"}
    assert set(orpheus["stages"]) == {"thinker", "talker", "voicebox"}  # qwen25_omni's Thinker
    assert orpheus["stages"]["thinker"].keys() == {"thinker LM (vLLM)", "audio tower (torch)"}
    assert qwen3["stages"].keys() == {"thinker", "talker", "voicebox"}
    assert qwen3["stages"]["talker"].keys() == {"talker LM (vLLM)",
                                                "code predictor, codec head (torch)"}
    for family in (omni, orpheus, qwen3):
        assert "levels" not in family and family["gpu_profile"] is None  # nothing started
        for parts in family["stages"].values():
            for size in parts.values():
                assert size["parameters"] > 0 and size["weight_bytes"] >= 2 * size["parameters"]
    # The weightless real-size release names its tensors as a saved release does (the experts
    # one by one): the tiny release the dry run built, written by transformers.
    header = safetensors_header(tmp_path / "m" / "qwen3_omni" / "release" / "model.safetensors")
    published = qwen3_stages.published_tensors(qwen3_size.release_tensors(qwen3_tiny_config()))
    assert {name: list(t.shape) for name, t in published.items()} == \
        {name: entry["shape"] for name, entry in header.items()}


def test_levels_are_counts_or_a_named_set() -> None:
    """`--levels vllm-omni` runs vLLM-Omni's published Qwen3-Omni concurrencies."""
    assert level_list("vllm-omni") == [1, 4, 10, 64]
    assert level_list("1,16") == [1, 16]
    for wrong in ("", "0,4", "some", "1,,2"):
        with pytest.raises(argparse.ArgumentTypeError, match="vllm-omni"):
            level_list(wrong)


def test_qwen3_omni_takes_the_gpu_settings_its_gpu_holds() -> None:
    """On an H200 (140 GiB) the `qwen3-omni` profile's bf16 settings, on an 80 GB GPU (79 GiB
    an H100's) `qwen3-omni-80gb`'s FP8; the other families have one."""
    assert gpu_profile("qwen3_omni", 143771 * 2**20) == "qwen3-omni"
    assert gpu_profile("qwen3_omni", 81559 * 2**20) == "qwen3-omni-80gb"
    assert gpu_profile("qwen25_omni", 81559 * 2**20) == "omni"


def safetensors_header(path: Path) -> dict[str, Any]:
    """A safetensors file's tensor entries (name: dtype, shape, offsets)."""
    with path.open("rb") as file:
        size = struct.unpack("<Q", file.read(8))[0]
        header: dict[str, Any] = json.loads(file.read(size))
    header.pop("__metadata__", None)
    return header


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA")
def test_refuses_in_one_line_without_cuda() -> None:
    done = subprocess.run([sys.executable, "-m", "agent.cli", "bench", "gpu"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stdout.splitlines() == [NO_CUDA]
