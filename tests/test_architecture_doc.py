"""docs/architecture.md draws the source tree: every package of the product is in it, so the
layout a newcomer reads is the one in the repository."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_in_the_drawn_tree() -> None:
    text = (REPO_ROOT / "docs" / "architecture.md").read_text()
    tree = text[text.index("```\n") + 4:]
    tree = tree[:tree.index("```")]
    packages = sorted(p.parent.relative_to(REPO_ROOT) for root in ("agent", "media", "pipeline")
                      for p in (REPO_ROOT / root).rglob("__init__.py"))
    assert len(packages) > 10
    # Each package appears by its last name with a slash ("calls/", "turn_taking/"); the
    # families are drawn on one line ("tiny/, local/, ...").
    missing = [str(p) for p in packages if f"{p.name}/" not in tree]
    assert missing == []
