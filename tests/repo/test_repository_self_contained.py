"""Nothing tracked reads from outside the clone: the paper's data lives in bench/data/compass-paper."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
from pathlib import Path

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


# Where a checkout without .git (an exported tree, an image) holds what git would not list: the
# folders .gitignore names, and the caches of tools run in it (some ignored by a global git
# config, not by .gitignore).
NOT_SOURCE = ("*_cache", ".git", ".hypothesis", "node_modules")


def tracked_files() -> list[str]:
    """The files git tracks in this checkout; without .git, the tree's source files."""
    if not (REPO_ROOT / ".git").exists():
        return source_files(REPO_ROOT)
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [name for name in listed.split("\0") if name]


def source_files(root: Path) -> list[str]:
    """Every file under root (relative, '/'-separated), less the folders .gitignore names
    ("name/" anywhere, "a/b/" from the root) and NOT_SOURCE."""
    ignore = root / ".gitignore"
    lines = ignore.read_text(encoding="utf-8").splitlines() if ignore.is_file() else []
    folders = [line.strip().rstrip("/") for line in lines if line.strip().endswith("/")]
    anywhere = [*NOT_SOURCE, *(f for f in folders if "/" not in f)]
    anchored = {f.lstrip("/") for f in folders if "/" in f}
    found = []
    for here, dirs, files in os.walk(root):
        base = Path(here).relative_to(root)
        dirs[:] = [
            d
            for d in dirs
            if not any(fnmatch.fnmatch(d, pattern) for pattern in anywhere)
            and (base / d).as_posix() not in anchored
        ]
        found += [(base / name).as_posix() for name in files]
    return sorted(found)


def test_without_git_the_tree_walk_leaves_out_what_git_would(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text(".venv/\n*.egg-info/\nbench/out/\n*.pyc\n")
    for name in (
        "README.md",
        "bench/run.py",
        "bench/outline.md",
        "src/pkg/mod.py",
        ".github/workflows/ci.yml",
        ".venv/lib/site.py",
        "src/pkg.egg-info/PKG-INFO",
        "bench/out/result.json",
        "src/pkg/.mypy_cache/x.json",
        ".hypothesis/examples/x",
        ".git/config",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert source_files(tmp_path) == [
        ".github/workflows/ci.yml",
        ".gitignore",
        "README.md",
        "bench/outline.md",
        "bench/run.py",
        "src/pkg/mod.py",
    ]


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
    assert len(listed) == 6
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
