"""The README stays a front door and the docs it points at hold together: every relative link
and anchor resolves, and the benchmark figures live in bench/README.md, with their commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
BENCH_README = REPO_ROOT / "bench" / "README.md"
PAGES = [README, BENCH_README, *sorted((REPO_ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    headings = re.findall(r"^#+ (.*)$", FENCE.sub("", text), re.M)
    return {_slug(h) for h in headings} | set(re.findall(r'<a id="([^"]+)"', text))


def _links(page: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text(encoding="utf-8")))
    return [link for link in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in link]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for link in _links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and target.is_file() and anchor not in _anchors(target):
            broken.append(f"{link} (no such heading)")
    assert not broken, f"{page.relative_to(REPO_ROOT)}: {broken}"


def test_the_readme_stays_a_front_door() -> None:
    """Issue 41: what it does, two commands, install, your workflow, reading it, links."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200, "move detail to docs/ (README is a front door)"
    sections = re.findall(r"^## (.*)$", FENCE.sub("", text), re.M)
    assert sections[:2] == ["Quick start", "Test"], sections
    assert "docs/images/demo-timeline.png" in text
    for page in ("method", "serving", "operations", "cli", "troubleshooting", "development"):
        assert f"(docs/{page}.md)" in text, f"the README does not link docs/{page}.md"
    assert "(bench/README.md)" in text


@pytest.mark.parametrize(
    ("page", "limit"), [("docs/method.md", 500), ("bench/README.md", 200)], ids=str
)
def test_the_reference_pages_stay_short(page: str, limit: int) -> None:
    """Issue 59: the method is each rule and why, bench/README.md one row a benchmark; history
    goes to bench/results/."""
    lines = (REPO_ROOT / page).read_text(encoding="utf-8").splitlines()
    assert len(lines) <= limit, (
        f"{page}: {len(lines)} lines, over {limit}: history to bench/results/"
    )


def test_no_commit_ids_in_what_users_read() -> None:
    """README.md, docs/ and bench/README.md say how and why, not which commit measured what."""
    pages = [README, REPO_ROOT / "bench" / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    found = {
        str(page.relative_to(REPO_ROOT)): hashes
        for page in pages
        if (
            hashes := [
                word
                for word in re.findall(r"\b[0-9a-f]{7,40}\b", page.read_text(encoding="utf-8"))
                if re.search(r"[a-f]", word) and re.search(r"[0-9]", word)
            ]
        )
    }
    assert not found, f"commit ids: {found}: history goes to bench/results/"


def test_every_benchmark_script_has_its_figures_in_bench_readme() -> None:
    """Each benchmark's latest figures are one row of bench/README.md, named by its command."""
    text = BENCH_README.read_text(encoding="utf-8")
    table = text.split("## Latest figures", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+\.py)", table, re.M)
    # Imported by other benches, or (train_forecaster.py) writing what forecast.py's row reads.
    helpers = {
        "operator_common.py",
        "forecasters.py",
        "trace_windows.py",
        "train_forecaster.py",
        "known_load.py",
    }
    scripts = {p.name for p in (REPO_ROOT / "bench").glob("*.py")} - helpers
    assert scripts <= set(rows), (
        f"no row in bench/README.md's Latest figures: {scripts - set(rows)}"
    )
