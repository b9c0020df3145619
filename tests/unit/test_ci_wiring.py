"""CI runs exactly the test command the README documents, so the two cannot drift."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CI_RUN = REPO_ROOT / ".ci" / "run"


def _section(markdown: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}[ \t]*\n(.*?)(?=^## |\Z)", markdown, re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def _first_fenced_block(text: str) -> list[str]:
    match = re.search(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    assert match, "section has no fenced code block"
    return [line.strip() for line in match.group(1).splitlines() if line.strip()]


def _readme_test_commands() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    commands = _first_fenced_block(_section(readme, "Test"))
    assert commands, "the README's Test block is empty"
    return commands


def _ci_command_lines() -> list[str]:
    lines = CI_RUN.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def test_readme_test_command_is_what_ci_runs() -> None:
    """Every command in the README's Test block is a command line of .ci/run."""
    ci_lines = _ci_command_lines()
    for command in _readme_test_commands():
        assert command in ci_lines, (
            f"{command!r} (README 'Test') is not run by .ci/run:\n{ci_lines}"
        )


def test_readme_quick_start_mentions_the_test_command() -> None:
    """The Quick start shows the same test command as the Test section."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    quick = "\n".join(_first_fenced_block(_section(readme, "Quick start")))
    for command in _readme_test_commands():
        assert command in quick, f"{command!r} missing from the README's Quick start"


def test_ci_run_is_executable() -> None:
    """CI invokes .ci/run directly."""
    assert os.access(CI_RUN, os.X_OK), ".ci/run is not executable"
