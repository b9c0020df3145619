"""The embedded RAG example and the replay-ledger builder the demo and the benchmark share."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compass.domain.space import Space, config_key
from compass.examples import build_replay_ledger, load_rag_paper, replay_scores

REPO_ROOT = Path(__file__).resolve().parents[2]
PAPER_DATA = REPO_ROOT / "bench" / "data" / "compass-paper" / "search_rag_grid_100.json"


@pytest.mark.parametrize("accuracy", [0.0, 0.01, 0.3, 0.5, 0.7998528138528138, 0.864, 0.999, 1.0])
@pytest.mark.parametrize("n", [1, 7, 100, 200])
def test_replay_scores_mean_is_the_accuracy(accuracy: float, n: int) -> None:
    """floor(a*n) ones, one remainder, zeros: the full mean is the recorded accuracy."""
    scores = replay_scores(accuracy, n, np.random.default_rng(0))
    assert len(scores) == n
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert sum(scores) == accuracy * n
    assert math.isclose(float(np.mean(scores)), accuracy, abs_tol=1e-12)
    ones = math.floor(accuracy * n)
    assert scores.count(1.0) == ones
    fractional = [s for s in scores if 0.0 < s < 1.0]
    assert len(fractional) <= 1
    assert scores.count(0.0) == n - ones - len(fractional)


def test_replay_scores_places_values_by_the_rng_permutation() -> None:
    """The sorted scores (ones, remainder, zeros) are gathered through rng.permutation(n)."""
    n = 10
    scores = replay_scores(0.35, n, np.random.default_rng(42))
    base = np.array([1.0, 1.0, 1.0, 0.5, 0, 0, 0, 0, 0, 0])
    expected = base[np.random.default_rng(42).permutation(n)]
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("accuracy", "n"), [(-0.1, 10), (1.5, 10), (0.5, 0)])
def test_replay_scores_rejects_impossible_input(accuracy: float, n: int) -> None:
    """An accuracy outside [0, 1] or an empty dataset cannot be replayed."""
    with pytest.raises(ValueError, match="must be"):
        replay_scores(accuracy, n, np.random.default_rng(0))


def test_build_replay_ledger_draws_one_rng_in_row_order() -> None:
    """Each line is replay_scores of its row, drawn from one generator seeded once."""
    rows: list[dict[str, Any]] = [
        {"config": {"k": 1}, "accuracy": 0.5},
        {"config": {"k": 2}, "accuracy": 0.25},
        {"config": {"k": 3}, "accuracy": 0.9},
    ]
    lines = build_replay_ledger(rows, 20, seed=7)
    rng = np.random.default_rng(7)
    assert lines == [
        {"config": row["config"], "scores": replay_scores(float(row["accuracy"]), 20, rng)}
        for row in rows
    ]
    assert build_replay_ledger(rows, 20, seed=7) == lines
    assert build_replay_ledger(rows, 20, seed=8) != lines
    # The lines are plain JSON: exactly what a replay ledger file holds.
    assert json.loads(json.dumps(lines)) == lines


def test_rag_paper_is_the_papers_grid() -> None:
    """234 rows, one per configuration of the space (reranker_k <= retriever_k)."""
    spec, rows = load_rag_paper()
    space = Space.from_spec(spec)
    assert space.size == 234
    assert len(rows) == 234
    assert all(set(row) == {"config", "accuracy"} for row in rows)
    assert all(0.0 <= row["accuracy"] <= 1.0 for row in rows)
    indices = {space.index(row["config"]) for row in rows}
    assert indices == set(range(234))
    assert [p.name for p in space.parameters] == [
        "generator_model",
        "retriever_k",
        "reranker_k",
        "reranker_model",
    ]
    assert spec["constraints"] == ["reranker_k <= retriever_k"]


def test_rag_paper_rows_are_the_recorded_ones() -> None:
    """The embedded rows are the paper's all_evaluated list, config and accuracy only."""
    recorded = json.loads(PAPER_DATA.read_text(encoding="utf-8"))["all_evaluated"]
    _, rows = load_rag_paper()
    assert {config_key(r["config"]): r["accuracy"] for r in rows} == {
        config_key(r["config"]): r["accuracy"] for r in recorded
    }
