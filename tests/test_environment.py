"""The environment table (pipeline/environment.py): the product touches the environment only
through it, it refuses names it does not hold, it leaves what the operator set, and
docs/operations.md lists exactly its variables."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pipeline import environment

REPO_ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("agent", "media", "pipeline")
TABLE = REPO_ROOT / "pipeline" / "environment.py"


def environment_reaches(path: Path) -> list[str]:
    """Where `path` reads or writes the process environment directly: os.environ, os.getenv,
    os.putenv, os.unsetenv, or any of them imported from os."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "os"
                and node.attr in {"environ", "environb", "getenv", "putenv", "unsetenv"}):
            found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} os.{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [f"{path.relative_to(REPO_ROOT)}:{node.lineno} from os import {a.name}"
                      for a in node.names if a.name in {"environ", "getenv", "putenv"}]
    return found


def test_only_the_table_touches_the_environment() -> None:
    sources = [p for root in PRODUCT for p in (REPO_ROOT / root).rglob("*.py") if p != TABLE]
    assert len(sources) > 100
    reaches = [r for path in sources for r in environment_reaches(path)]
    assert reaches == []
    # The scan sees a reach where there is one.
    assert environment_reaches(TABLE)


def test_a_name_not_in_the_table_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_SOMETHING_NEW", raising=False)
    for use in (lambda: environment.get("VLLM_SOMETHING_NEW"),
                lambda: environment.put("VLLM_SOMETHING_NEW", "1"),
                lambda: environment.set_default("VLLM_SOMETHING_NEW", "1"),
                lambda: environment.child_environment({"VLLM_SOMETHING_NEW": "1"})):
        with pytest.raises(KeyError, match="VLLM_SOMETHING_NEW is not in omnivox's environment"):
            use()


def test_defaults_leave_what_the_operator_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_HOST_IP", "10.0.0.7")
    assert environment.set_default("VLLM_HOST_IP") == "10.0.0.7"
    monkeypatch.delenv("VLLM_HOST_IP")
    assert environment.set_default("VLLM_HOST_IP") == "127.0.0.1"  # the table's default
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    with pytest.raises(ValueError, match="no default"):
        environment.set_default("VLLM_RPC_BASE_PATH")
    environment.put("VLLM_RPC_BASE_PATH", "/run/omnivox")
    assert environment.get("VLLM_RPC_BASE_PATH") == "/run/omnivox"
    environment.put("VLLM_RPC_BASE_PATH", None)
    assert environment.get("VLLM_RPC_BASE_PATH") is None
    child = environment.child_environment({"PYTHONUNBUFFERED": "1"})
    assert child["PYTHONUNBUFFERED"] == "1" and "PATH" in child


def test_the_operations_doc_lists_the_table() -> None:
    text = (REPO_ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("## Environment"):]
    section = section[:section.index("\n## ", 1)]
    listed = re.findall(r"^\| `([A-Z0-9_]+)` \| ([^|]*) \|", section, re.MULTILINE)
    assert [name for name, _ in listed] == list(environment.VARIABLES)
    for name, default in listed:
        assert default.strip() == (environment.VARIABLES[name].default or ""), name
