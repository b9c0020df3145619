"""Nothing tracked reads from outside the clone: the paper's data lives in bench/data/compass-paper."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PAPER_DATA = REPO_ROOT / "bench" / "data" / "compass-paper"
# Prose may tell the story of where the data came from; code, tests and scripts may not go there.
PROSE = ("docs/", "notes/")
# Built from pieces so that this file does not match itself.
SHARED = "shar" + "ed"
OUTSIDE = re.compile(
    rf"""\.\./{SHARED}\b"""  # the folder beside the clone, as a relative path
    rf"""|\b{SHARED}/data\b"""  # its data folder, reached any other way
    rf"""|["']{SHARED}["']\s*/"""  # a pathlib join through it
)


def tracked_files() -> list[str]:
    """The files git tracks in this checkout."""
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to list the tracked files with")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [name for name in listed.split("\0") if name]


def test_no_tracked_file_points_outside_the_clone() -> None:
    """No code, test, bench or script names the shared folder beside the clone (docs and notes may)."""
    offenders = []
    for name in tracked_files():
        path = REPO_ROOT / name
        if name.startswith(PROSE) or not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE.search(line):
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert not offenders, "reads from outside the clone:\n" + "\n".join(offenders)


def test_the_pattern_catches_the_old_spellings() -> None:
    """The guard sees the spellings the readers used before the data moved in."""
    for line in (
        f'DATA = REPO_ROOT.parent / "{SHARED}" / "data" / "compass-paper"',
        f"python hack/gen_rag_sim.py [--data ../{SHARED}/data/compass-paper]",
        f"PAPER = Path(__file__).resolve().parents[3] / '{SHARED}' / 'data'",
    ):
        assert OUTSIDE.search(line), line
    assert not OUTSIDE.search('policies.create("shared", policy_spec(triton))')


def test_the_paper_data_is_tracked() -> None:
    """Every data file the README lists is in the repository, so a clone has it."""
    names = set(tracked_files())
    readme = (PAPER_DATA / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([\w.]+\.json)` \|", readme, flags=re.MULTILINE))
    assert len(listed) == 5
    for file in sorted(listed):
        assert f"bench/data/compass-paper/{file}" in names, file


def test_bench_scripts_import_the_installed_package() -> None:
    """No bench script edits sys.path: they run on the package installed in .venv (editable)."""
    edits = [
        f"{script.relative_to(REPO_ROOT)}:{number}"
        for script in sorted((REPO_ROOT / "bench").glob("*.py"))
        for number, line in enumerate(script.read_text(encoding="utf-8").splitlines(), start=1)
        if re.search(r"\bsys\.path\b", line)
    ]
    assert not edits, f"sys.path edited in {edits}"
