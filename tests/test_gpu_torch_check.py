"""`omnivox bench gpu-torch` rehearsed on the CPU at tiny size: every part's figures, the levels
of streams asked for, and no vLLM (nor the server's stack) imported: the check runs behind an
import blocker, so a module that starts importing vLLM fails it here before it fails on a GPU
host that has none."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from agent.bench.gpu_tests import pytest_outcome
from agent.bench.gpu_torch import FORBIDDEN
from agent.bench.gpu_torch_kit import Target
from agent.bench.gpu_torch_qwen3 import thinker_rows_part

ROOT = Path(__file__).resolve().parents[1]
FIGURE_PARTS = ("token2wav", "audio_tower", "snac", "thinker_states", "qwen3_audio_tower",
                "qwen3_code_predictor", "qwen3_code2wav", "qwen3_thinker_rows")
# Runs the check as `python -m agent.bench.gpu_torch ARGS` with the named top-level packages
# made unimportable (as on a GPU host that lacks them).
BLOCKED_RUN = """
import importlib.abc, runpy, sys
blocked = set(sys.argv[1].split(","))
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"blocked in this test: {name}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
sys.argv = ["gpu_torch", *sys.argv[2:]]
runpy.run_module("agent.bench.gpu_torch", run_name="__main__")
"""


def run_check(tmp_path: Path, blocked: tuple[str, ...], *args: str) -> dict[str, Any]:
    out = tmp_path / "check.json"
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_RUN, ",".join(blocked), "--size", "tiny", "--device",
         "cpu", "--json", str(out), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def numbers(tree: Any) -> list[float]:
    """Every number in a JSON tree (booleans aside)."""
    if isinstance(tree, dict):
        return [n for value in tree.values() for n in numbers(value)]
    if isinstance(tree, list):
        return [n for value in tree for n in numbers(value)]
    return [float(tree)] if isinstance(tree, int | float) and not isinstance(tree, bool) else []


def test_tiny_check_measures_every_part_without_vllm(tmp_path: Path) -> None:
    result = run_check(tmp_path, FORBIDDEN, "--streams", "1,2",
                       "--parts", ",".join(FIGURE_PARTS))
    assert result["forbidden_imported"] == []
    assert result["streams"] == [1, 2]
    assert set(result["parts"]) == set(FIGURE_PARTS)
    for name, part in result["parts"].items():
        assert "error" not in part and "not_run" not in part, (name, part)
        figures = numbers(part)
        assert figures and all(math.isfinite(n) and n > 0 for n in figures), (name, part)
    for name in ("token2wav", "snac"):
        levels = result["parts"][name]["levels"]
        assert [level["streams"] for level in levels] == [1, 2]
        assert all(level["rtf_total"] > 0 and level["first_window_p50_s"] > 0
                   for level in levels)
    assert [row["audio_s"] for row in result["parts"]["audio_tower"]["utterances"]] == [1, 2, 8]
    assert result["parts"]["thinker_states"]["layers_cut"] is False
    assert [row["requests"] for row in result["parts"]["thinker_states"]["batched_steps"]] == [1, 2]
    qwen3 = {name.removeprefix("qwen3_"): part for name, part in result["parts"].items()
             if name.startswith("qwen3_")}
    assert [row["audio_s"] for row in qwen3["audio_tower"]["utterances"]] == [1, 2, 8]
    assert [row["rows"] for row in qwen3["audio_tower"]["utterances"]] == [13, 26, 104]
    assert [row["frames"] for row in qwen3["code_predictor"]["levels"]] == [1, 2]
    assert qwen3["code_predictor"]["codebooks_predicted"] == 15
    code2wav = qwen3["code2wav"]
    assert [level["streams"] for level in code2wav["levels"]] == [1, 2]
    assert code2wav["frames_per_group"] == [1, 1, 1, 2, 4, 1]  # 10 frames, as the Talker cuts
    assert [row["rows"] for row in qwen3["thinker_rows"]["prompts"]] == [64, 512]
    assert [row["requests"] for row in qwen3["thinker_rows"]["reply_rows"]] == [1, 2]
    assert set(result["estimate"]["parts"]) == set(FIGURE_PARTS)


def test_real_layer_copy_is_skipped_where_the_gpu_lacks_the_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At real size the Thinker's layer copy (28.4 GiB in bfloat16) runs only where it fits the
    device's free memory with room for its activations; otherwise it says why, building
    nothing."""
    free = 20 * 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * 2**30))
    target = Target("real", torch.device("cuda"), torch.bfloat16)
    row = thinker_rows_part(target, [1])
    assert row == {"not_run": "skipped: the first 24 layers and the embedding table take 28.4 "
                   "GiB in bfloat16, with 4 GiB beside them for activations; 20.0 GiB of the "
                   "device are free"}


def test_snac_missing_is_reported_not_raised(tmp_path: Path) -> None:
    result = run_check(tmp_path, (*FORBIDDEN, "snac"), "--streams", "1", "--parts", "snac")
    assert result["parts"]["snac"]["not_run"].startswith("not run: snac not installed")


def test_test_file_missing_a_module_is_not_run(tmp_path: Path) -> None:
    """A test file that cannot be collected for a missing module (the CUDA IPC tests on a host
    without msgspec or zmq) is reported as not run, naming the module."""
    test = tmp_path / "tests" / "test_needs_absent.py"
    test.parent.mkdir()
    test.write_text("import omnivox_absent_module\n\n\ndef test_x():\n    pass\n")
    outcome = pytest_outcome(test)
    assert outcome["outcome"] == "not run: omnivox_absent_module not installed"
