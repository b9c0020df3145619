"""The evaluator factory that `compass search` and the operator's search Job share."""

from __future__ import annotations

import sys

import pytest

from compass.domain.evaluation import ParamValue
from compass.evaluators.command import CommandEvaluator
from compass.evaluators.factory import ScoreSource, make_evaluator
from compass.evaluators.ledger import Ledger, ReplayEvaluator
from compass.evaluators.triton import TritonEvaluator

A: dict[str, ParamValue] = {"retriever_k": 5}


def test_a_source_names_exactly_one_place_scores_come_from() -> None:
    """None, or two at once, is refused before any evaluator is built."""
    with pytest.raises(ValueError, match="exactly one"):
        ScoreSource()
    with pytest.raises(ValueError, match="exactly one"):
        ScoreSource(command=["true"], triton="localhost:8001")


def test_replay_serves_the_recorded_scores() -> None:
    """A replay source replays the very ledger it was given."""
    ledger = Ledger("recorded")
    ledger.add(A, [0, 1], [1.0, 0.0])
    evaluator = make_evaluator(ScoreSource(replay=ledger))
    assert isinstance(evaluator, ReplayEvaluator)
    assert evaluator.evaluate(A, [1, 0]) == [0.0, 1.0]


def test_command_runs_that_argv() -> None:
    """A command source runs the program with its arguments as given."""
    argv = [sys.executable, "-c", "print('[1]')"]
    evaluator = make_evaluator(ScoreSource(command=argv))
    assert isinstance(evaluator, CommandEvaluator)
    assert evaluator.argv == argv
    assert evaluator.evaluate(A, [0]) == [1.0]


def test_triton_addresses_the_router_model() -> None:
    """A Triton source talks to the named router model, the client's default when unnamed."""
    named = make_evaluator(ScoreSource(triton="localhost:1", router_model="rag"))
    default = make_evaluator(ScoreSource(triton="localhost:1"))
    assert isinstance(named, TritonEvaluator)
    assert isinstance(default, TritonEvaluator)
    assert (named.router.url, named.router.model) == ("localhost:1", "rag")
    assert default.router.model == "router"
