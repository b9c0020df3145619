"""Concurrent evaluation gives the sequential search's answer: the same feasible set, verdicts and
ledger facts at any concurrency and reply order, and a killed search redoes only what was in
flight."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from compass.console import describe_rate
from compass.domain.evaluation import Config, EvaluationError
from compass.domain.search import Progress, SearchMethod, SearchOutcome, SearchSettings, search
from compass.domain.space import Space
from compass.evaluators.concurrency import ThreadRunner, VirtualRunner, check_concurrency
from compass.evaluators.factory import ScoreSource, make_runner
from compass.evaluators.ledger import (
    CheckpointedEvaluator,
    CheckpointLedger,
    Ledger,
    ReplayEvaluator,
    read_ledger,
)
from compass.examples import RAG_PAPER_SAMPLES, build_replay_ledger, load_rag_paper

CONCURRENCIES = (1, 4, 16, 64)


@cache
def rag_grid() -> tuple[Space, Ledger]:
    """The paper's RAG space and a replay ledger of its 234 configurations."""
    spec, rows = load_rag_paper()
    ledger = Ledger("rag")
    for line in build_replay_ledger(rows, RAG_PAPER_SAMPLES, seed=3):
        ledger.add(line["config"], range(RAG_PAPER_SAMPLES), line["scores"])
    return Space.from_spec(spec), ledger


def verdicts(outcome: SearchOutcome) -> dict[int, tuple[str, int, float]]:
    """Each evaluated configuration's verdict, sample count and accuracy."""
    return {a.index: (a.verdict.value, a.samples, a.accuracy) for a in outcome.assessments}


def facts(ledger: Ledger) -> set[tuple[str, int, float]]:
    """A ledger's content as a set of (configuration, sample, score), whatever its line order."""
    return {
        (str(sorted(config.items())), index, score)
        for config in ledger.configs()
        for index, score in ledger.scores(config).items()
    }


def random_service(seed: int) -> Any:
    """Service times drawn at random per request: replies come back in a seed-given order."""
    rng = random.Random(seed)
    return lambda config, index: rng.expovariate(1.0)


class ShufflingEvaluator:
    """Replays scores after a random delay, from many threads: replies in any order."""

    def __init__(self, inner: ReplayEvaluator, seed: int, fail_after: int | None = None) -> None:
        self.inner = inner
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.calls = 0
        self.fail_after = fail_after

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """The replayed scores, late by up to 1 ms."""
        with self.lock:
            self.calls += 1
            delay = self.rng.random() * 0.001
            failing = self.fail_after is not None and self.calls > self.fail_after
        time.sleep(delay)
        if failing:
            raise EvaluationError("the evaluator was killed")
        return self.inner.evaluate(config, sample_indices)


@pytest.mark.parametrize("tau", [0.5, 0.8])
def test_virtual_concurrency_and_reply_order_do_not_change_the_answer(
    tau: float, tmp_path: Path
) -> None:
    space, ledger = rag_grid()
    settings = SearchSettings(tau=tau, seed=1)
    answers = []
    for k in CONCURRENCIES:
        for seed in (0, 1):
            checkpoint = CheckpointLedger(tmp_path / f"{k}-{seed}.jsonl")
            evaluator = CheckpointedEvaluator(ReplayEvaluator(ledger), checkpoint)
            runner = VirtualRunner(evaluator, k, random_service(seed + k))
            outcome = search(space, evaluator, RAG_PAPER_SAMPLES, settings, runner=runner)
            answers.append(
                (
                    [a.index for a in outcome.feasible],
                    verdicts(outcome),
                    outcome.stop_reason,
                    facts(read_ledger(checkpoint.path)),
                )
            )
    assert answers[0][0], "the threshold must leave something feasible to compare"
    assert all(answer == answers[0] for answer in answers[1:])
    # The same as one chunk at a time through the plain evaluator.
    sequential = search(space, ReplayEvaluator(ledger), RAG_PAPER_SAMPLES, settings)
    assert verdicts(sequential) == answers[0][1]


def test_threads_in_any_reply_order_give_the_sequential_answer_and_ledger(tmp_path: Path) -> None:
    space, ledger = rag_grid()
    settings = SearchSettings(tau=0.75, seed=2)
    expected_checkpoint = CheckpointLedger(tmp_path / "sequential.jsonl")
    expected = search(
        space,
        CheckpointedEvaluator(ReplayEvaluator(ledger), expected_checkpoint),
        RAG_PAPER_SAMPLES,
        settings,
    )
    for k, piece in ((16, None), (64, 1)):
        checkpoint = CheckpointLedger(tmp_path / f"threads-{k}.jsonl")
        evaluator = CheckpointedEvaluator(
            ShufflingEvaluator(ReplayEvaluator(ledger), k), checkpoint
        )
        runner = ThreadRunner(evaluator, k, piece=piece)
        try:
            outcome = search(space, evaluator, RAG_PAPER_SAMPLES, settings, runner=runner)
        finally:
            runner.close()
        assert verdicts(outcome) == verdicts(expected)
        assert facts(read_ledger(checkpoint.path)) == facts(read_ledger(expected_checkpoint.path))


def test_grid_is_the_same_at_any_concurrency() -> None:
    space, ledger = rag_grid()
    settings = SearchSettings(tau=0.6, method=SearchMethod.GRID)
    sequential = search(space, ReplayEvaluator(ledger), RAG_PAPER_SAMPLES, settings)
    evaluator = ReplayEvaluator(ledger)
    concurrent = search(
        space,
        evaluator,
        RAG_PAPER_SAMPLES,
        settings,
        runner=VirtualRunner(evaluator, 16, random_service(5)),
    )
    assert verdicts(concurrent) == verdicts(sequential)
    assert len(sequential.assessments) == space.size


def test_a_killed_concurrent_search_resumes_redoing_only_what_was_in_flight(
    tmp_path: Path,
) -> None:
    space, ledger = rag_grid()
    settings = SearchSettings(tau=0.8, seed=4)
    path = tmp_path / "ledger.jsonl"
    killed = ShufflingEvaluator(ReplayEvaluator(ledger), seed=9, fail_after=400)
    first = CheckpointedEvaluator(killed, CheckpointLedger(path))
    runner = ThreadRunner(first, 16, piece=1)
    with pytest.raises(EvaluationError, match="killed"):
        search(space, first, RAG_PAPER_SAMPLES, settings, runner=runner)
    # Calls still running when the search stopped may finish and be recorded: wait for them.
    runner.pool.shutdown(wait=True)
    recorded = read_ledger(path).fact_count
    assert 0 < recorded <= 400

    inner = ShufflingEvaluator(ReplayEvaluator(ledger), seed=10)
    resumed = CheckpointedEvaluator(inner, CheckpointLedger(path))
    runner = ThreadRunner(resumed, 16, piece=1)
    try:
        outcome = search(space, resumed, RAG_PAPER_SAMPLES, settings, runner=runner)
    finally:
        runner.close()
    uninterrupted = search(space, ReplayEvaluator(ledger), RAG_PAPER_SAMPLES, settings)
    assert verdicts(outcome) == verdicts(uninterrupted)
    # Every recorded sample is reused and nothing is evaluated twice: the new evaluations are
    # exactly the search's samples that the killed run had not recorded.
    assert resumed.reused == recorded
    assert resumed.computed == uninterrupted.sample_evals - recorded
    assert read_ledger(path).fact_count == uninterrupted.sample_evals


def test_the_batch_not_the_concurrency_decides_which_configurations_are_evaluated() -> None:
    space, ledger = rag_grid()
    one = search(space, ReplayEvaluator(ledger), RAG_PAPER_SAMPLES, SearchSettings(0.8, batch=1))
    wide = search(space, ReplayEvaluator(ledger), RAG_PAPER_SAMPLES, SearchSettings(0.8, batch=32))
    # A wider batch may evaluate a few more configurations, never find fewer feasible ones.
    assert {a.index for a in one.feasible} == {a.index for a in wide.feasible}
    assert wide.configs_evaluated >= one.configs_evaluated


@pytest.mark.parametrize("bad", [0, -1, 10_000])
def test_concurrency_out_of_range_names_the_field(bad: int) -> None:
    with pytest.raises(ValueError, match=r"evaluation\.concurrency must be between 1 and"):
        check_concurrency(bad, "evaluation.concurrency")


def test_batch_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="batch must be between 1 and"):
        SearchSettings(0.5, batch=0)


def test_progress_rate_and_eta_bound() -> None:
    # 600 samples over 60 s is 10 a second; 20 configurations at 30 samples each are left.
    snapshot = Progress("completing", 20, 600, 3, 40)
    assert describe_rate(snapshot, 60.0) == "10.0 eval/s  ETA <= 1:00"
    assert describe_rate(Progress("seeding", 0, 0, 0, 40), 5.0) == "-- eval/s"
    long = Progress("completing", 1, 1, 0, 10_000)
    assert describe_rate(long, 1.0) == "1.0 eval/s  ETA <= 2:46:39"


class CountingEvaluator:
    """Replays scores from many threads and counts how often each sample is scored."""

    def __init__(self, inner: ReplayEvaluator, wrong_length: bool = False) -> None:
        self.inner = inner
        self.lock = threading.Lock()
        self.scored: dict[tuple[str, int], int] = {}
        self.wrong_length = wrong_length

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """The replayed scores (one short when asked to be wrong)."""
        with self.lock:
            for index in sample_indices:
                key = (str(sorted(config.items())), int(index))
                self.scored[key] = self.scored.get(key, 0) + 1
        scores = self.inner.evaluate(config, sample_indices)
        return scores[:-1] if self.wrong_length else scores


def test_samples_scored_ahead_are_handed_over_and_recorded_only_when_asked_for(
    tmp_path: Path,
) -> None:
    space, ledger = rag_grid()
    config = space.config(0)
    counting = CountingEvaluator(ReplayEvaluator(ledger))
    checkpoint = CheckpointLedger(tmp_path / "ledger.jsonl")
    evaluator = CheckpointedEvaluator(counting, checkpoint)
    runner = ThreadRunner(evaluator, 4, piece=1)
    try:
        runner.submit(0, config, [0, 1])
        runner.expect(config, [2, 3, 4, 5])
        # Two workers are free while the chunk is out: they score samples 2 and 3 ahead.
        done = runner.finished()
        while not done:
            done = runner.finished()
        assert [ticket for ticket, _ in done] == [0]
        assert facts(read_ledger(checkpoint.path)) == {
            (str(sorted(config.items())), i, ledger.scores(config)[i]) for i in (0, 1)
        }
        runner.submit(1, config, [2, 3])
        scores = []
        while not scores:
            scores = runner.finished()
        assert scores == [(1, [ledger.scores(config)[i] for i in (2, 3)])]
        runner.forget(config)
    finally:
        runner.close()
        runner.pool.shutdown(wait=True)
    # Each sample was scored once; the ledger holds what was asked for and nothing ahead.
    assert all(count == 1 for count in counting.scored.values())
    recorded = {index for _, index, _ in facts(read_ledger(checkpoint.path))}
    assert recorded == {0, 1, 2, 3}
    assert runner.sent == len(counting.scored) == 4 + runner.wasted
    assert evaluator.computed == 4


def test_scoring_ahead_shortens_the_wall_time_and_changes_nothing_recorded(
    tmp_path: Path,
) -> None:
    space, ledger = rag_grid()
    settings = SearchSettings(tau=0.85, seed=1, batch=8)
    results = {}
    for ahead in (0, None):
        checkpoint = CheckpointLedger(tmp_path / f"ahead-{ahead}.jsonl")
        evaluator = CheckpointedEvaluator(ReplayEvaluator(ledger), checkpoint)
        runner = VirtualRunner(evaluator, 64, random_service(3), ahead=ahead)
        outcome = search(space, evaluator, RAG_PAPER_SAMPLES, settings, runner=runner)
        results[ahead] = (runner, verdicts(outcome), facts(read_ledger(checkpoint.path)))
        # Every sample sent was either recorded or scored ahead for nothing.
        assert runner.sent == outcome.sample_evals + runner.wasted
    plain, ahead = results[0], results[None]
    assert ahead[1] == plain[1]
    assert ahead[2] == plain[2]
    assert plain[0].wasted == 0
    assert ahead[0].wasted > 0
    assert ahead[0].clock < 0.8 * plain[0].clock


def test_a_call_returning_the_wrong_number_of_scores_is_named(tmp_path: Path) -> None:
    space, ledger = rag_grid()
    wrong = CountingEvaluator(ReplayEvaluator(ledger), wrong_length=True)
    runner = ThreadRunner(wrong, 4, piece=2)
    try:
        runner.submit(0, space.config(0), [0, 1, 2])
        with pytest.raises(EvaluationError, match="returned 1 scores for 2 samples"):
            runner.finished()
    finally:
        runner.close()


def test_threads_scoring_ahead_send_what_is_recorded_plus_what_is_wasted(tmp_path: Path) -> None:
    space, ledger = rag_grid()
    settings = SearchSettings(tau=0.9, seed=5, batch=8)
    runs = {}
    for ahead in (0, None):
        counting = CountingEvaluator(ReplayEvaluator(ledger))
        checkpoint = CheckpointLedger(tmp_path / f"threads-{ahead}.jsonl")
        evaluator = CheckpointedEvaluator(counting, checkpoint)
        runner = ThreadRunner(evaluator, 32, piece=1, ahead=ahead)
        try:
            outcome = search(space, evaluator, RAG_PAPER_SAMPLES, settings, runner=runner)
        finally:
            runner.close()
            runner.pool.shutdown(wait=True)
        assert read_ledger(checkpoint.path).fact_count == outcome.sample_evals
        assert all(count == 1 for count in counting.scored.values())
        assert runner.sent == len(counting.scored) == outcome.sample_evals + runner.wasted
        runs[ahead] = (verdicts(outcome), facts(read_ledger(checkpoint.path)), runner.sent)
    assert runs[None][:2] == runs[0][:2]
    assert runs[0][2] == len(runs[0][1]) < runs[None][2]


def test_triton_requests_score_ahead_and_command_processes_do_not() -> None:
    _, ledger = rag_grid()
    evaluator = ReplayEvaluator(ledger)
    triton = make_runner(ScoreSource(triton="127.0.0.1:8001"), evaluator, 8)
    command = make_runner(ScoreSource(command=["score"]), evaluator, 8)
    try:
        assert isinstance(triton, ThreadRunner)
        assert (triton.piece, triton.ahead) == (1, None)
        assert isinstance(command, ThreadRunner)
        assert (command.piece, command.ahead) == (None, 0)
    finally:
        for runner in (triton, command):
            if isinstance(runner, ThreadRunner):
                runner.close()
