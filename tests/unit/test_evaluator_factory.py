"""The evaluator factory that `compass search` and the operator's search Job share."""

from __future__ import annotations

import sys
import threading

import pytest

from compass.api.compoundworkflow import CompoundWorkflowSpec
from compass.commands import job
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


def test_the_search_jobs_override_spreads_its_threads_over_every_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """COMPASS_TRITON_ADDRESS as the operator's override hands it to the search Job, a
    comma-separated list of pods (no kube-proxy): each evaluating thread takes the next one."""
    spec = CompoundWorkflowSpec.model_validate(
        {
            "space": {"parameters": [{"name": "retriever_k", "values": [5, 10]}]},
            "evaluation": {
                "dataset": {"size": 10},
                "tau": 0.8,
                "evaluator": {"type": "triton"},
                "concurrency": 4,
            },
            "slo": {"latencyMs": 300},
            "triton": {"service": "rag", "routerModel": "rag-router"},
        }
    )
    monkeypatch.setenv("COMPASS_TRITON_ADDRESS", "127.0.2.1:8001, 127.0.2.2:8001")
    source = job._score_source(spec, "ns")
    evaluator = make_evaluator(source)
    assert isinstance(evaluator, TritonEvaluator)
    routers = [evaluator.router]

    def take() -> None:
        routers.append(evaluator._router())  # what a runner's worker thread evaluates with

    for _ in range(3):
        worker = threading.Thread(target=take)
        worker.start()
        worker.join()
    assert [r.url for r in routers] == ["127.0.2.1:8001", "127.0.2.2:8001"] * 2
    assert {r.model for r in routers} == {"rag-router"}
    for router in routers:
        router.close()
    # Without the override: the Service's own address (one gRPC endpoint, its load balancing).
    monkeypatch.delenv("COMPASS_TRITON_ADDRESS")
    assert job._score_source(spec, "ns").triton == "rag.ns.svc:8001"
