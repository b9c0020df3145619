"""bench/clump_edge.py: its count of clumps' edges on made-up runs, and one real window."""

from __future__ import annotations

import numpy as np
import pytest
from bench_runner import bench_module, run_bench

from compass.domain.simulator import RunReport


def run_of(starts: list[float], took: list[float], configs: list[int]) -> RunReport:
    """A run of a clump of len(starts) requests arriving at 0 (a DROPPED config is -1)."""
    n = len(starts)
    return RunReport(
        label="run",
        slo_ms=1000.0,
        names=("fast", "slow"),
        accuracies=(0.7, 0.8),
        arrivals_s=np.zeros(n),
        starts_s=np.array(starts),
        finishes_s=np.array(starts) + np.array(took),
        configs=np.array(configs),
        ticks=(),
        switches=0,
        time_in_config_s=(0.0, 0.0),
    )


def test_the_edge_lost_to_static_fastest_is_counted_with_its_cause() -> None:
    """Static fastest serves a clump of 4 with its edge (request 3) in time; the policy takes
    two slower members and admission refuses the edge: one lost, at the edge, refused."""
    edges = bench_module("clump_edge")
    fastest = run_of([0.0, 0.24, 0.48, 0.72], [0.24, 0.24, 0.24, 0.24], [0, 0, 0, 0])
    policy = run_of([0.0, 0.3, 0.6, 0.9], [0.3, 0.3, 0.3, 0.0], [1, 1, 0, -1])
    found = edges.clump_edges(policy, fastest, 3)
    assert (found.clumps, found.fastest_kept, found.policy_kept) == (1, 1, 0)
    assert len(found.lost) == 1
    lost = found.lost[0]
    assert (lost.position, lost.refused, lost.slower_ahead) == (3, True, 2)
    assert lost.left_ms == pytest.approx(100.0)
    assert lost.later_ms == pytest.approx(180.0)


def test_a_clump_behind_a_queue_is_not_counted() -> None:
    """A clump static fastest starts late (a queue stood ahead) is not one at an idle pipeline."""
    edges = bench_module("clump_edge")
    fastest = run_of([0.1, 0.34, 0.58, 0.82], [0.24] * 4, [0] * 4)
    assert edges.clump_edges(fastest, fastest, 3).clumps == 0


def test_the_bench_prints_each_window_of_the_trace(capsys: pytest.CaptureFixture[str]) -> None:
    """One set of real windows end to end: each window's line, its clumps and its losses."""
    assert run_bench("clump_edge.py", ["--set", "held-out"]) == 0
    out = capsys.readouterr().out
    assert out.count("held-out mooncake-conversation@0.4+") == 2
    assert out.count("clumps longer than 7 at an idle pipeline") == 2
    assert "lost at the edge" in out
