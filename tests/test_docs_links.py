"""The project's Markdown documents link to files and headings that exist.

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


def heading_anchors(document: Path) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated heading suffixed -1, -2, ..."""
    text = re.sub(r"```.*?```", "", document.read_text(encoding="utf-8"), flags=re.S)
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def dead_anchors(document: Path) -> list[str]:
    """Links to a heading (``file.md#anchor`` or ``#anchor``) whose document has no such heading."""
    text = re.sub(r"```.*?```", "", document.read_text(encoding="utf-8"), flags=re.S)
    dead = []
    for target in (m.group(1) for m in LINK.finditer(text)):
        if "#" not in target or re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        file, anchor = target.split("#", 1)
        linked = document.parent / file if file else document
        if linked.suffix == ".md" and linked.is_file() and anchor not in heading_anchors(linked):
            dead.append(target)
    return dead


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_to_headings_resolve(document: Path) -> None:
    dead = dead_anchors(document)
    assert not dead, f"{document.relative_to(ROOT)} links to headings that do not exist: {dead}"


def test_a_dead_heading_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Which member drafts: `drafter=\"auto\"`\n## Notes\n## Notes\n")
    document = tmp_path / "page.md"
    document.write_text("[a](other.md#which-member-drafts-drafterauto) [b](other.md#notes-1) [c](#top)\n"
                        "[d](other.md#which-member-drafts) [e](other.md#notes-2)\n# Top\n")
    assert dead_anchors(document) == ["other.md#which-member-drafts", "other.md#notes-2"]


def test_the_readme_links_its_moved_measurements() -> None:
    targets = set(relative_targets(ROOT / "README.md"))
    assert {"docs/speed.md", "docs/results/analyses.md", "docs/results/standing.png"} <= targets


def test_a_dead_link_is_found(tmp_path: Path) -> None:
    document = tmp_path / "page.md"
    document.write_text("see [the plot](plots/missing.png), [the site](https://example.org) and [here](#top)\n")
    assert relative_targets(document) == ["plots/missing.png"]
