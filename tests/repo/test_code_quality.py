"""Static checks as tests: ruff, ruff format, mypy (strict) and import-linter must all pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# Tools from the same environment as the running interpreter, never whatever is on PATH.
BIN_DIR = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=600
    )


@pytest.mark.parametrize(
    ("name", "cmd"),
    [
        # No cache: whether an import is first-party depends on files elsewhere in the tree,
        # which ruff's per-file cache does not see move, so a warm cache passes what CI refuses.
        ("ruff check", (sys.executable, "-m", "ruff", "check", "--no-cache", ".")),
        ("ruff format", (sys.executable, "-m", "ruff", "format", "--check", ".")),
        # No arguments: mypy reads files, strict and plugins from pyproject.toml.
        ("mypy", (sys.executable, "-m", "mypy")),
        ("lint-imports", (str(BIN_DIR / "lint-imports"),)),
    ],
)
def test_tool_passes(name: str, cmd: tuple[str, ...]) -> None:
    """Each tool exits 0; on failure its full output is the assertion message."""
    result = _run(*cmd)
    assert result.returncode == 0, (
        f"{name} failed (exit {result.returncode}): {' '.join(cmd)}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )
