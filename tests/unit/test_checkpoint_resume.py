"""Checkpointing: every batch is on disk at once, and a restarted search re-evaluates nothing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from compass.domain.evaluation import Config, EvaluationError, ParamValue
from compass.evaluators.ledger import (
    CheckpointedEvaluator,
    CheckpointLedger,
    LedgerError,
    partial_path,
    read_ledger,
)

A: dict[str, ParamValue] = {"retriever_k": 5, "model": "small"}
B: dict[str, ParamValue] = {"retriever_k": 10, "model": "large"}


class CountingEvaluator:
    """A deterministic evaluator that records every call it receives."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, ParamValue], list[int]]] = []

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        self.calls.append((dict(config), list(sample_indices)))
        return [self.score(config, i) for i in sample_indices]

    @staticmethod
    def score(config: Config, index: int) -> float:
        return (index * 7 + int(config["retriever_k"])) % 11 / 10


class BrokenEvaluator:
    """An evaluator that answers with a fixed (possibly invalid) list."""

    def __init__(self, answer: list[float]) -> None:
        self.answer = answer

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        return self.answer


def test_append_is_on_disk_and_readable_immediately(tmp_path: Path) -> None:
    """Each append is one checkpoint-format line that read_ledger accepts, with no close."""
    path = tmp_path / "sub" / "ckpt.jsonl"
    checkpoint = CheckpointLedger(path)
    checkpoint.append(A, [3, 1], [0.5, 1.0])
    checkpoint.append(B, [0], [0.0])
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"config": A, "samples": [3, 1], "scores": [0.5, 1.0]},
        {"config": B, "samples": [0], "scores": [0.0]},
    ]
    assert read_ledger(path).scores(A) == {1: 1.0, 3: 0.5}


def test_resume_serves_recorded_facts_without_calling_inner(tmp_path: Path) -> None:
    """A second run over the same checkpoint asks the inner evaluator for nothing it has."""
    path = tmp_path / "ckpt.jsonl"
    first_inner = CountingEvaluator()
    first = CheckpointedEvaluator(first_inner, CheckpointLedger(path))
    expected_a = first.evaluate(A, range(10))
    first.evaluate(B, [0, 1, 2])
    assert first.computed == 13
    assert first.reused == 0

    # The pod restarts: a fresh process opens the same file.
    inner = CountingEvaluator()
    resumed = CheckpointedEvaluator(inner, CheckpointLedger(path))
    assert resumed.checkpoint.facts_at_open == 13
    assert resumed.evaluate(A, range(10)) == expected_a
    assert resumed.evaluate(B, [2, 0]) == [CountingEvaluator.score(B, i) for i in (2, 0)]
    assert inner.calls == []
    assert resumed.reused == 12
    assert resumed.computed == 0


def test_only_missing_indices_are_evaluated_in_one_call_in_request_order(tmp_path: Path) -> None:
    """A partly known batch asks inner once for the rest, and returns everything in order."""
    checkpoint = CheckpointLedger(tmp_path / "ckpt.jsonl")
    checkpoint.append(A, [0, 1, 2], [0.0, 0.1, 0.2])
    inner = CountingEvaluator()
    evaluator = CheckpointedEvaluator(inner, checkpoint)
    scores = evaluator.evaluate(A, [7, 1, 5, 0, 7])
    assert inner.calls == [(A, [7, 5])]  # the repeated 7 is evaluated once
    assert scores == [
        CountingEvaluator.score(A, 7),
        0.1,
        CountingEvaluator.score(A, 5),
        0.0,
        CountingEvaluator.score(A, 7),
    ]
    assert evaluator.reused == 2
    assert evaluator.computed == 2
    # The new facts are checkpointed, so a restart would not ask for them again.
    assert {5, 7} <= read_ledger(checkpoint.path).scores(A).keys()


def test_torn_tail_is_cut_before_the_next_append(tmp_path: Path) -> None:
    """After a crash mid-write, the next line starts on a clean line, not glued to garbage."""
    path = tmp_path / "ckpt.jsonl"
    good = json.dumps({"config": A, "samples": [0], "scores": [1.0]}) + "\n"
    torn = '{"config": {"retriever_k": 10, "mo'
    path.write_text(good + torn)
    checkpoint = CheckpointLedger(path)
    assert path.read_text() == good  # truncated on open, before any append
    # ... but the cut line is set aside, never deleted.
    assert checkpoint.set_aside == len(torn)
    assert partial_path(path).read_text() == torn + "\n"
    checkpoint.append(B, [0], [0.5])
    ledger = read_ledger(path)
    assert ledger.configs() == [A, B]
    assert path.read_text().count("\n") == 2


def test_missing_final_newline_is_added_before_the_next_append(tmp_path: Path) -> None:
    """A valid last line without its newline gets one, so both lines survive."""
    path = tmp_path / "ckpt.jsonl"
    path.write_text(json.dumps({"config": A, "scores": [1.0]}))
    checkpoint = CheckpointLedger(path)
    checkpoint.append(B, [0], [0.5])
    assert read_ledger(path).configs() == [A, B]


def test_conflicting_append_is_refused_and_not_written(tmp_path: Path) -> None:
    """A batch contradicting a recorded fact never reaches the file (it would block resume)."""
    path = tmp_path / "ckpt.jsonl"
    checkpoint = CheckpointLedger(path)
    checkpoint.append(A, [0, 1], [1.0, 0.0])
    before = path.read_bytes()
    with pytest.raises(LedgerError, match=r"sample 1 .*0\.0"):
        checkpoint.append(A, [1], [1.0])
    with pytest.raises(LedgerError, match="outside"):
        checkpoint.append(A, [5], [1.5])
    with pytest.raises(LedgerError, match="negative"):
        checkpoint.append(B, [-1], [1.0])
    assert path.read_bytes() == before
    # Re-recording the same fact is harmless.
    checkpoint.append(A, [1], [0.0])
    assert read_ledger(path).scores(A) == {0: 1.0, 1: 0.0}


def test_corrupt_checkpoint_is_reported_on_open(tmp_path: Path) -> None:
    """A bad line in the middle is not silently discarded: open fails naming the line."""
    path = tmp_path / "ckpt.jsonl"
    path.write_text(
        '{"config": {"k": 1}, "scores": [0.5, 2]}\n{"config": {"k": 2}, "scores": []}\n'
    )
    with pytest.raises(LedgerError, match=r"ckpt\.jsonl line 1: .*outside \[0, 1\]"):
        CheckpointLedger(path)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ([0.5], "returned 1 scores for 2 samples"),
        ([0.5, 1.5], "returned score 1.5"),
        ([0.5, float("nan")], "returned score nan"),
    ],
)
def test_invalid_inner_scores_are_not_checkpointed(
    tmp_path: Path, answer: list[float], expected: str
) -> None:
    """Scores a resume could not read back raise EvaluationError and leave the file unchanged."""
    path = tmp_path / "ckpt.jsonl"
    evaluator = CheckpointedEvaluator(BrokenEvaluator(answer), CheckpointLedger(path))
    with pytest.raises(EvaluationError, match=expected):
        evaluator.evaluate(A, [0, 1])
    assert path.read_bytes() == b""
    assert evaluator.computed == 0
