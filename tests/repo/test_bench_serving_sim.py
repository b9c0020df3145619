"""bench/serving_sim.py runs end to end on one SLO, one pattern and one seed."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from bench_runner import bench_module
from bench_runner import run_bench as run_script

from compass.domain.admission import service_quantiles_ms
from compass.domain.profiles import LatencyProfile

# The floors' verdict lines, in the order the bench prints them (the spike floor only when the
# run has the 1000 ms spike cell).
COMPLIANCE_FLOOR = "compliance within 1.5 points of static fastest, every SLO and pattern"
ACCURACY_FLOOR = "accuracy gain >= 25% of the fastest-to-accurate gap, every SLO and pattern"
SPIKE_FLOOR = "spike at 1000 ms"


def run_bench(argv: list[str], **constants: Any) -> int:
    """Run bench/serving_sim.py in-process with some module constants overridden."""
    return run_script("serving_sim.py", argv, **constants)


def assert_floors_pass(out: str, floors: Sequence[str]) -> None:
    """The bench printed exactly these floors' verdicts, in order, and every one is PASS."""
    verdicts = [line for line in out.splitlines() if line.startswith(("PASS ", "FAIL "))]
    # The message shows the section as printed: a FAIL's detail lines name the failing cells.
    start = out.find("floors (")
    section = out[start:].split("\n\n", 1)[0] if start >= 0 else "(the bench printed no floors)"
    assert len(verdicts) == len(floors), section
    for verdict, floor in zip(verdicts, floors, strict=True):
        assert verdict.split(" ", 1)[1].startswith(floor), section
        assert verdict.startswith("PASS "), section


def table_row(out: str, slo: str, pattern: str) -> str:
    """The policies table's row for one cell."""
    return next(line for line in out.splitlines() if line.split()[:2] == [slo, pattern])


def test_serving_bench_prints_the_table_the_floors_and_the_paper_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One cell, in-process: the front, a table row, the floor verdicts, the paper comparison."""
    argv = ["--seeds", "1", "--jobs", "1", "--slos", "1000", "--patterns", "spike"]
    code = run_bench(argv)
    out = capsys.readouterr().out
    assert code == 0
    assert "Pareto front of 4" in out
    rows = [line for line in out.splitlines() if line.split()[:2] == ["1000", "spike"]]
    assert len(rows) == 3  # the policies, oracle and threshold-model tables
    cells = rows[0].split()[2:7]
    compliance = [float(cell.split("/")[0]) for cell in cells]
    assert all(0 <= c <= 100 for c in compliance)
    assert compliance[0] > compliance[2]  # static fastest beats static most accurate on a spike
    assert_floors_pass(out, (COMPLIANCE_FLOOR, ACCURACY_FLOOR, SPIKE_FLOOR))
    assert "spike_slo1000" in out  # the paper's run beside the simulator's


def test_seed_offset_draws_other_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    """--seed-offset 100 serves seeds from 100 (a held-out set), not the default seeds."""
    argv = ["--seeds", "1", "--jobs", "1", "--slos", "500", "--patterns", "bursty"]
    assert run_bench(argv) == 0
    default = capsys.readouterr().out
    assert run_bench([*argv, "--seed-offset", "100"]) == 0
    held_out = capsys.readouterr().out
    assert "1 seeds from 0" in default
    assert "1 seeds from 100" in held_out
    assert_floors_pass(default, (COMPLIANCE_FLOOR, ACCURACY_FLOOR))
    assert_floors_pass(held_out, (COMPLIANCE_FLOOR, ACCURACY_FLOOR))
    # Bursty draws its bursts from the seed: another seed, another static fastest's figure.
    assert table_row(default, "500", "bursty") != table_row(held_out, "500", "bursty")
    with pytest.raises(SystemExit):
        run_bench([*argv, "--seed-offset", "-1"])


def test_a_failing_floor_fails_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    """With the spike floor out of reach the bench prints FAIL for it, and the check fails."""
    argv = ["--seeds", "1", "--jobs", "1", "--slos", "1000", "--patterns", "spike"]
    assert run_bench(argv, SPIKE_MARGIN=1000.0) == 0  # the bench itself always exits 0
    out = capsys.readouterr().out
    assert any(line.startswith(f"FAIL {SPIKE_FLOOR}") for line in out.splitlines())
    with pytest.raises(AssertionError, match="FAIL spike at 1000 ms"):
        assert_floors_pass(out, (COMPLIANCE_FLOOR, ACCURACY_FLOOR, SPIKE_FLOOR))
    with pytest.raises(AssertionError, match="printed no floors"):
        assert_floors_pass("", (COMPLIANCE_FLOOR,))


def test_strategies_are_measured_against_the_oracle_and_written_as_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The oracle section prints each strategy's share of the oracle's gain and its floors;
    --json writes one row per cell and policy with the fields the issue names."""
    target = tmp_path / "cells.json"
    argv = ["--seeds", "1", "--jobs", "1", "--slos", "750", "--patterns", "spike,step"]
    assert run_bench([*argv, "--json", str(target)]) == 0
    out = capsys.readouterr().out
    section = out[out.index("strategies against the hindsight oracle") :]
    strategies = (
        "elastico",
        "split",
        "elastico+adm",
        "split+adm",
        "predictive",
        "predictive+adm",
        "elastico+deg",
        "predictive+deg",
    )
    for strategy in strategies:
        assert sum(f" {strategy}: " in line for line in section.splitlines()) == 3
    assert "THE ORACLE IS WRONG" not in section
    assert "known load (told the load ahead, not the arrivals): " in section
    cells = json.loads(target.read_text(encoding="utf-8"))["cells"]
    assert {(c["pattern"], c["policy"]) for c in cells} == {
        (pattern, policy)
        for pattern in ("spike", "step")
        for policy in (
            "elastico",
            "elastico-paper-mean",
            "split",
            "elastico+admission",
            "split+admission",
            "predictive",
            "predictive+admission",
            "elastico+degrade-only",
            "predictive+degrade-only",
            "binding",
            "binding+admission",
        )
    }
    # Late binding's own floors (issue 43), for both runs.
    floors = section[section.index("late binding floors") :]
    for label in ("binding", "binding+adm"):
        assert sum(f" {label}: " in line for line in floors.splitlines()) == 3
    by_policy = {(c["pattern"], c["policy"]): c for c in cells}
    for cell in cells:
        assert cell["slo_ms"] == 750
        assert 0 <= cell["compliance_pct"] <= 100
        # Only admission drops; a dropped request is a miss.
        admitting = cell["policy"].endswith("+admission")
        assert cell["dropped_pct"] == 0 or admitting
        if admitting and cell["pattern"] == "spike":
            assert cell["dropped_pct"] > 0
        assert cell["compliance_pct"] <= 100 - cell["dropped_pct"]
        if cell["policy"].endswith("+degrade-only"):
            # Admission that refuses nothing serves what the refusing one drops, late: it
            # keeps less in time under the spike than refusing does.
            refusing = by_policy[
                cell["pattern"], cell["policy"].replace("degrade-only", "admission")
            ]
            if cell["pattern"] == "spike":
                assert cell["compliance_pct"] < refusing["compliance_pct"]
        # The oracle sits between static fastest and the most accurate on accuracy, and keeps
        # static fastest's compliance.
        assert cell["fastest"]["accuracy"] <= cell["oracle_accuracy"]
        assert cell["oracle_accuracy"] <= cell["accurate"]["accuracy"]
        assert cell["oracle_compliance_pct"] >= cell["fastest"]["compliance_pct"] - 0.5
        # Knowing the load, not the arrivals, still serves the accurate members between.
        known = cell["known_load_oracle"]
        assert cell["fastest"]["accuracy"] < known["accuracy"] <= cell["accurate"]["accuracy"]


def test_admission_beyond_the_oracle_is_told_apart_from_a_wrong_oracle(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Refusing doomed requests frees the queue (the oracle serves every one): at 500 ms under
    the spike, admission that degrades late keeps more requests in time than the oracle, with
    more accuracy; the bench says so instead of calling the oracle wrong."""
    argv = ["--seeds", "1", "--jobs", "1", "--slos", "500", "--patterns", "spike"]
    assert run_bench([*argv, "--degrade-after", "0.4"]) == 0
    out = capsys.readouterr().out
    assert "THE ORACLE IS WRONG" not in out
    assert "no strategy that serves every request with one mix at a time beats the oracle" in out
    refusing = next(line for line in out.splitlines() if "by refusing requests" in line)
    assert "500 ms spike: predictive+adm" in refusing


def test_late_last_runs_everything_on_that_queue_beside_a_fifo_static_fastest(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--late-last: every run and the oracle on late-last queues; static fastest also FIFO, in
    its own column and JSON field; in a spike at 500 ms the order alone lifts static fastest."""
    target = tmp_path / "cells.json"
    argv = ["--seeds", "1", "--jobs", "1", "--slos", "500", "--patterns", "spike", "--late-last"]
    assert run_bench([*argv, "--json", str(target)]) == 0
    out = capsys.readouterr().out
    assert "fastest fifo" in out
    assert "THE ORACLE IS WRONG" not in out
    # The known-load oracle draws FIFO queues only: not run here.
    assert "known load" not in out
    cells = json.loads(target.read_text(encoding="utf-8"))["cells"]
    for cell in cells:
        assert cell["fastest"]["compliance_pct"] > cell["fastest_fifo"]["compliance_pct"] + 5
        assert cell["fastest"]["accuracy"] == cell["fastest_fifo"]["accuracy"]
        assert "known_load_oracle" not in cell
        assert cell["oracle_compliance_pct"] >= cell["fastest"]["compliance_pct"] - 0.5


def test_real_load_cells_come_from_trace_windows_split_into_tuning_and_held_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--traces: each window of a shipped trace at each utilisation is a cell of its own, in the
    tuning or the held-out section (never both), against the hindsight oracle; the busier the
    window, the lower static fastest's compliance."""
    json_path = tmp_path / "cells.json"
    argv = ["--jobs", "1", "--slos", "1000", "--patterns", "", "--traces"]
    argv += ["azure-llm-conv-2023", "--windows", "2", "--window-s", "120"]
    argv += ["--utilisations", "0.3,1.5", "--json", str(json_path)]
    assert run_bench(argv) == 0
    out = capsys.readouterr().out
    tuning, held_out = out.split("real load: TUNING windows")[1].split(
        "real load: HELD-OUT windows"
    )
    labels = {
        section: [
            line.split()[1]
            for line in text.splitlines()
            if line.split()[:1] == ["1000"] and "@" in line.split()[1]
        ]
        for section, text in (("tuning", tuning), ("held-out", held_out))
    }
    assert len(labels["tuning"]) == len(labels["held-out"]) == 2  # one window x 2 utilisations
    assert not set(labels["tuning"]) & set(labels["held-out"])
    document = json.loads(json_path.read_text(encoding="utf-8"))
    assert sorted(document["held_out"]) == sorted(labels["held-out"])
    fastest = {
        (cell["pattern"]): cell["fastest"]["compliance_pct"]
        for cell in document["cells"]
        if cell["policy"] == "elastico"
    }
    for label in labels["tuning"] + labels["held-out"]:
        assert label.startswith("azure-llm-conv-2023@")
    light, heavy = sorted(labels["tuning"], key=lambda label: float(label.split("@")[1][:3]))
    assert fastest[light] > fastest[heavy]  # 1.5x the capacity on average cannot keep up


def test_real_load_refuses_an_unknown_trace(capsys: pytest.CaptureFixture[str]) -> None:
    """A trace that is not shipped is a usage error naming the flag and the shipped ones."""
    with pytest.raises(SystemExit) as exit_info:
        run_bench(["--traces", "nope", "--jobs", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--traces: no shipped trace nope" in err
    assert "azure-llm-code-2023" in err


def test_binding_only_runs_late_binding_against_static_fastest_and_the_oracle(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--binding-only: late binding's table and floors alone; refusing what would be late keeps
    more requests in time than static fastest under the spike at 500 ms, and both binding runs
    win accuracy over static fastest."""
    argv = ["--seeds", "1", "--jobs", "1", "--slos", "500", "--patterns", "spike"]
    assert run_bench([*argv, "--binding-only"]) == 0
    out = capsys.readouterr().out
    assert "strategies against the hindsight oracle" not in out
    row = next(line for line in out.splitlines() if line.strip().startswith("500 spike"))
    # fastest and oracle: compliance/accuracy; each binding run: compliance/ share%.
    numbers = [float(x) for x in re.findall(r"[\d.]+", row.replace("%", ""))]
    fastest, _, _, _, _, binding_share, admitted, admitted_share, dropped = numbers[1:]
    assert admitted > fastest + 5
    assert dropped > 0
    assert binding_share > 50
    assert admitted_share > 50
    assert "late binding floors" in out


def test_binding_sees_what_the_router_sees_by_default_and_behind_a_gate_on_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """By default late binding counts followers as the router's poller does (every 25 ms);
    'off' is blind, and --binding-gate sees the requests waiting at the router's gate: three
    views of the same arrivals, which the spike at 500 ms tells apart."""
    argv = ["--seeds", "1", "--jobs", "1", "--slos", "500", "--patterns", "spike", "--binding-only"]

    def row(*flags: str) -> str:
        assert run_bench([*argv, *flags]) == 0
        out = capsys.readouterr().out
        return next(line for line in out.splitlines() if line.strip().startswith("500 spike"))

    polled = row()
    assert row("--binding-poll-ms", "25") == polled
    assert row("--binding-poll-ms", "off") != polled
    assert row("--binding-gate", "8", "--degrade-after", "1") != polled
    for flags, message in (
        (["--binding-poll-ms", "0"], "--binding-poll-ms must be a period > 0"),
        (["--binding-poll-ms", "soon"], "--binding-poll-ms must be a period > 0"),
        (["--binding-gate", "1"], "--binding-gate must be >= 2"),
        (["--binding-rate", "gate-arrivals"], "gate-arrivals needs --binding-gate"),
        (["--binding-lag-reserve", "-1"], "--binding-lag-reserve must be >= 0"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            run_bench([*argv, *flags])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_a_request_is_late_once_even_the_fastest_would_miss_the_slo() -> None:
    """late_after_ms: the SLO less the fastest's service at the quantile, never negative."""
    late_after_ms = bench_module("serving_sim").late_after_ms
    fast = LatencyProfile({"c": "fast"}, 0.7, 100.0, 116.45, p50_ms=100.0, std_ms=10.0)
    median = service_quantiles_ms([fast], 0.5)[0]
    assert late_after_ms(500, fast) == pytest.approx(500 - median)
    assert late_after_ms(500, fast, 0.9) < late_after_ms(500, fast)
    assert late_after_ms(50, fast) == 0.0
