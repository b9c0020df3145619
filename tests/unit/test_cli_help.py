"""`compass --version`, the help texts, and --plot without matplotlib."""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
from cli_inputs import PROFILES

from compass.commands.main import SUBCOMMANDS, main

REPO = Path(__file__).resolve().parents[2]


def test_version_prints_the_projects_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`compass --version` exits 0 with pyproject.toml's version."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"compass {project['version']}\n"


def test_help_names_every_subcommand_in_its_description(capsys: pytest.CaptureFixture[str]) -> None:
    """`compass --help` lists each subcommand and its description says what each is for."""
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    description, listing = (" ".join(part.split()) for part in out.split("positional arguments:"))
    for name, summary in SUBCOMMANDS.items():
        assert re.search(rf"\b{name}\b", description), f"the description leaves out {name}"
        assert f"{name} {' '.join(summary.split()[:4])}" in listing


def test_operator_help_describes_the_scheduler_not_a_timer_per_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`compass operator --help` says how policies run now: one scheduler, no kopf timers."""
    assert main(["operator", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "timer" not in text
    assert "one scheduler ticks every policy" in text
    assert "CompoundWorkflow controller" in text


def test_plot_without_matplotlib_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain install has no matplotlib: --plot is one usage line naming the extra, exit 2."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "profiles.json").write_text(json.dumps({"profiles": PROFILES}))
    # None in sys.modules makes `import matplotlib` raise ImportError, as where it is absent.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    code = main(["plan", "--profiles", "profiles.json", "--slo-ms", "800", "--plot", "f.png"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == [
        "compass plan: error: --plot needs matplotlib, which is not installed: "
        "pip install 'compass-operator[plot]' (compass demo's figures need it too)"
    ]
    assert not (tmp_path / "f.png").exists()
