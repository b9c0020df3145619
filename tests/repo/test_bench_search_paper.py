"""bench/search_paper.py runs end to end on a small slice of the paper's RAG grid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bench_runner import run_bench as run_script

# The floors' labels, in the order the bench prints its "FLOOR PASS: " / "FLOOR FAIL: " lines.
FLOORS = (
    "(a) COMPASS-V mean recall",
    "(b) COMPASS-V no seed below",
    "(c) COMPASS-V mean savings",
    "(d) COMPASS-V on the reference's schedule",
)


def run_bench(argv: list[str], **constants: Any) -> int:
    """Run bench/search_paper.py in-process with some module constants overridden."""
    return run_script("search_paper.py", argv, **constants)


def assert_floors_pass(out: str) -> None:
    """The bench printed the four floors' verdicts, in order, and every one is PASS."""
    verdicts = [line for line in out.splitlines() if line.startswith("FLOOR ")]
    shown = "\n".join(verdicts) or "(the bench printed no floors)"
    assert len(verdicts) == len(FLOORS), shown
    for verdict, floor in zip(verdicts, FLOORS, strict=True):
        assert verdict.startswith(("FLOOR PASS: " + floor, "FLOOR FAIL: " + floor)), shown
        assert verdict.startswith("FLOOR PASS: "), shown


def test_search_paper_bench_prints_table_and_floors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One seed, two RAG thresholds, in-process: the table rows, floors and ASCII plot appear."""
    argv = ["--seeds", "1", "--jobs", "1", "--only", "rag", "--taus", "0.8,0.9"]
    code = run_bench([*argv, "--plot", str(tmp_path / "plot.png")])
    out = capsys.readouterr().out
    assert code == 0
    assert "rag: 234 configurations" in out
    assert (
        "schedules: defaults betting adaptive; reference betting 10,25,50,100; "
        "ref-wilson wilson 10,25,50,100" in out
    )
    rows = [line for line in out.splitlines() if line.startswith("rag ")]
    assert [line.split()[1] for line in rows] == ["0.8", "0.9"]
    assert rows[0].split()[2] == "33"  # ground-truth feasible at tau 0.8
    assert rows[1].split()[2] == "0"
    # Every variant's recall and savings, and no paper reference for RAG.
    assert all(line.count("|") == 5 and line.endswith("-       -") for line in rows), rows
    assert "COMPASS-V, reference" in out
    assert "COMPASS-V, ref-wilson" in out
    assert_floors_pass(out)
    assert "rag tau=0.8 (ground truth 33 feasible)" in out
    assert "Wall time:" in out


def test_a_failing_floor_fails_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the savings floor out of reach the bench prints FAIL for it, and the check fails."""
    # tau 0.9 alone: nothing is feasible, so the search is the cheapest one on the grid.
    argv = ["--seeds", "1", "--jobs", "1", "--only", "rag", "--taus", "0.9"]
    assert run_bench([*argv, "--plot", str(tmp_path / "plot.png")], FLOOR_SAVINGS=1.01) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("FLOOR FAIL: (c)") for line in out.splitlines())
    with pytest.raises(AssertionError, match="FLOOR FAIL: \\(c\\)"):
        assert_floors_pass(out)
    with pytest.raises(AssertionError, match="printed no floors"):
        assert_floors_pass("")


def test_vision_rows_carry_the_papers_own_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A vision threshold prints the reference COMPASS-V's recall and savings from the paper."""
    argv = ["--seeds", "1", "--first-seed", "3", "--jobs", "1", "--only", "vision"]
    code = run_bench([*argv, "--taus", "0.55", "--plot", str(tmp_path / "plot.png")])
    out = capsys.readouterr().out
    assert code == 0
    assert "Seeds: 3..3" in out
    assert "reference betting 10,25,50,100,200" in out
    (row,) = [line for line in out.splitlines() if line.startswith("vision ")]
    # The authors' run at 0.55: recall 1.0, 79.3% fewer evaluations than their grid.
    assert row.endswith(" 1.000   79.3%"), row
