"""The project's Markdown documents link to files that exist.

The README's measurements live in docs/ (speed.md, results/analyses.md, results/earlier-runs.md) and point back
and forth; a moved or renamed file must not leave a reader at a dead link or a missing plot."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "cookbooks").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def relative_targets(document: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", document.read_text(encoding="utf-8"), flags=re.S)  # code blocks are not links
    targets = [m.group(1).split("#")[0] for m in LINK.finditer(text)]
    return [t for t in targets if t and not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # skip http:, mailto:, anchors


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(document: Path) -> None:
    missing = [t for t in relative_targets(document) if not (document.parent / t).exists()]
    assert not missing, f"{document.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_the_readme_links_its_moved_measurements() -> None:
    targets = set(relative_targets(ROOT / "README.md"))
    assert {"docs/speed.md", "docs/results/analyses.md", "docs/results/standing.png"} <= targets


def test_a_dead_link_is_found(tmp_path: Path) -> None:
    document = tmp_path / "page.md"
    document.write_text("see [the plot](plots/missing.png), [the site](https://example.org) and [here](#top)\n")
    assert relative_targets(document) == ["plots/missing.png"]
