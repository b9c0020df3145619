"""bench/search_paper.py runs end to end on a small slice of the paper's RAG grid."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "bench" / "search_paper.py"


def test_search_paper_bench_prints_table_and_floors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One seed, two RAG thresholds, in-process: the table rows, floors and ASCII plot appear."""
    spec = importlib.util.spec_from_file_location("bench_search_paper", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        code = module.main(
            [
                "--seeds",
                "1",
                "--jobs",
                "1",
                "--only",
                "rag",
                "--taus",
                "0.8,0.9",
                "--plot",
                str(tmp_path / "plot.png"),
            ]
        )
    finally:
        sys.modules.pop(spec.name, None)
    out = capsys.readouterr().out
    assert code == 0
    assert "rag: 234 configurations" in out
    assert "budgets 10,15,20,30,40,50,60,70,85,100" in out
    rows = [line for line in out.splitlines() if line.startswith("rag ")]
    assert [line.split()[1] for line in rows] == ["0.8", "0.9"]
    assert rows[0].split()[2] == "33"  # ground-truth feasible at tau 0.8
    assert rows[1].split()[2] == "0"
    for floor in ("(a)", "(b)", "(c)"):
        assert any(
            line.startswith(("FLOOR PASS: " + floor, "FLOOR FAIL: " + floor))
            for line in out.splitlines()
        ), floor
    assert "rag tau=0.8 (ground truth 33 feasible)" in out
    assert "Wall time:" in out
